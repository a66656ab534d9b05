"""Routes by method and path, for every edge: exact paths by dictionary, paths with `{name}`
segments by pattern; a path that exists with other methods is 405 with its `Allow` list."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from mqgate.errors import MethodNotAllowed, NotFound


class Routed(Protocol):
    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...  # "{name}" segments are parameters


R = TypeVar("R", bound=Routed)


class WrongMethod(MethodNotAllowed):
    def __init__(self, path: str, allowed: list[str]) -> None:
        super().__init__(f"{path} accepts {', '.join(allowed)}", field="method")
        self.allow = ", ".join(allowed)


class Router(Generic[R]):
    def __init__(self, routes: list[R], *, missing: str = "no route") -> None:
        """`missing`: how a path with no route is named in the 404 ("no route /x")."""
        self.routes = routes
        self.missing = missing
        self._exact: dict[str, dict[str, R]] = {}
        self._patterns: list[tuple[list[str], dict[str, R]]] = []
        for r in routes:
            if "{" in r.path:
                segs = r.path.strip("/").split("/")
                for existing, methods in self._patterns:
                    if existing == segs:
                        methods[r.method] = r
                        break
                else:
                    self._patterns.append((segs, {r.method: r}))
            else:
                self._exact.setdefault(r.path, {})[r.method] = r

    def match(self, method: str, path: str) -> tuple[R, dict[str, str]]:
        methods = self._exact.get(path)
        if methods is not None:
            route = methods.get(method)
            if route is None:
                raise WrongMethod(path, sorted(methods))
            return route, {}
        allowed: set[str] = set()
        parts = path.strip("/").split("/")
        for segs, candidate in self._patterns:
            if len(segs) == len(parts) and all(
                s == p or (s.startswith("{") and p) for s, p in zip(segs, parts, strict=True)
            ):
                route = candidate.get(method)
                if route is None:
                    allowed.update(candidate)  # another pattern may take this method
                    continue
                return route, {s[1:-1]: p for s, p in zip(segs, parts, strict=True) if s.startswith("{")}
        if allowed:
            raise WrongMethod(path, sorted(allowed))
        raise NotFound(f"{self.missing} {path}", field="path", code="no_route")
