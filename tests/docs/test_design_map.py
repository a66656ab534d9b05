"""docs/DESIGN.md's layer map is the code's: every package and top-level module of src/mqgate
has its row, each imports only what its row allows, and no two packages import each other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "mqgate"
DESIGN = ROOT / "docs" / "DESIGN.md"


def units() -> set[str]:
    """Packages and top-level modules of mqgate, by name."""
    found = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    found |= {p.stem for p in SRC.glob("*.py") if p.stem != "__init__"}
    return found


def rows() -> list[tuple[list[str], set[str] | None]]:
    """(the units a row names, what they may import; None: everything below the row)."""
    text = DESIGN.read_text()
    table = text.split("<!-- layers:start -->", 1)[1].split("<!-- layers:end -->", 1)[0]
    out: list[tuple[list[str], set[str] | None]] = []
    for line in table.strip().splitlines()[2:]:
        name, holds, may = (cell.strip() for cell in line.strip("|").split("|"))
        if name == "top level":
            named = [m.removesuffix(".py") for m in re.findall(r"`(\w+)\.py`", holds)]
        else:
            named = [n.strip("/").removesuffix(".py") for n in re.findall(r"`([\w/.]+)`", name)]
        allowed = None if may == "everything below" else set(re.findall(r"`(\w+)`", may))
        out.append((named, allowed))
    return out


def imports_of(unit: str) -> set[str]:
    """The other units `unit` imports (anywhere in its code, lazily or not)."""
    files = [SRC / f"{unit}.py"] if (SRC / f"{unit}.py").is_file() else list((SRC / unit).rglob("*.py"))
    names = units()
    found: set[str] = set()
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            modules: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mqgate"):
                modules = (
                    [node.module] if node.module != "mqgate" else [f"mqgate.{a.name}" for a in node.names]
                )
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names if a.name.startswith("mqgate.")]
            for m in modules:
                parts = m.split(".")
                if len(parts) > 1 and parts[1] in names and parts[1] != unit:
                    found.add(parts[1])
    return found


def test_every_package_and_module_has_its_row() -> None:
    listed = [u for named, _ in rows() for u in named]
    assert sorted(set(listed)) == sorted(listed), "a unit is listed twice"
    assert set(listed) == units(), (
        f"in the code but not in the map: {sorted(units() - set(listed))}; "
        f"in the map but not in the code: {sorted(set(listed) - units())}"
    )


def test_each_imports_only_what_its_row_allows() -> None:
    table = rows()
    wrong: list[str] = []
    for i, (named, allowed) in enumerate(table):
        below = {u for later, _ in table[i + 1 :] for u in later}
        may = below if allowed is None else allowed | set(named)
        for unit in named:
            extra = imports_of(unit) - may
            if extra:
                wrong.append(f"{unit} imports {sorted(extra)}")
    assert not wrong, "; ".join(wrong)


def test_no_two_packages_import_each_other() -> None:
    graph = {u: imports_of(u) for u in units()}

    def reaches(start: str, goal: str) -> bool:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    cycles = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if reaches(b, a)})
    assert not cycles, f"import cycles between packages: {cycles}"


def test_the_data_path_and_the_edges_import_no_feature_and_nothing_imports_the_cli() -> None:
    features = {"tracing", "queuestate", "failover", "alerts", "projects", "metrics_history", "platform"}
    assert not imports_of("services") & (features | {"api", "console", "app", "cli", "web"})
    assert "console" not in imports_of("api")
    assert not [u for u in units() if u != "cli" and "cli" in imports_of(u)]
