"""What the pages share: role checks against a record's project, and the records a user sees."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, TypeVar
from urllib.parse import urlencode

import msgspec

from mqgate.api.decoding import convert
from mqgate.api.limits import SettingsLimits
from mqgate.api.shapes import Input
from mqgate.console.app import Console, principal
from mqgate.console.projects import project_of, user_topics
from mqgate.errors import BadRequest, Forbidden, NotFound
from mqgate.registry.records import ConsumerRecord, ProducerRecord, Snapshot, TopicRecord
from mqgate.web.request import Request
from mqgate.web.response import Response, page

T = TypeVar("T")
S = TypeVar("S", bound=Input)


def fragment(console: Console, v: Request, template: str, /, **values: Any) -> Response:
    """A part of a page (static/console.js fetches it again); 304 without a body when the
    browser has it already (its ETag)."""
    response = console.page(v, template, **values)
    tag = b'"%s"' % hashlib.blake2b(response.body or b"", digest_size=12).hexdigest().encode()
    if v.headers.get(b"if-none-match") == tag:
        return page(b"", 304, headers=[(b"etag", tag)])
    response.headers.append((b"etag", tag))
    return response


def snapshot(c: Console) -> Snapshot:
    return c.gateway.ctx.registry.snapshot


def require_view(v: Request, project: str) -> None:
    if not principal(v).can_view(project):
        raise Forbidden(f"you have no role in project {project}", field="project")


def require_change(v: Request, project: str) -> None:
    if not principal(v).can_change(project):
        raise Forbidden(f"changing project {project} needs the owner or admin role", field="project")


async def consumer_for(c: Console, v: Request, change: bool = False) -> tuple[ConsumerRecord, str]:
    """The consumer the path names and its project, if the user may see that project (and
    change it, with `change`); one in a project the user cannot see answers as one that is not
    registered, so its name and project stay hidden."""
    name = v.params["name"]
    rec = await c.gateway.topology.consumer(name)
    project = project_of(snapshot(c), rec)
    if not principal(v).can_view(project):
        raise NotFound(f"consumer {name} is not registered", field="consumer")
    if change:
        require_change(v, project)
    return rec, project


def require_admin(v: Request) -> None:
    if not principal(v).is_admin:
        raise Forbidden("this needs the admin role", field="role")


class Listing(msgspec.Struct, frozen=True):
    """A snapshot's records by name, each with its project: made once per snapshot, as pages
    list thousands of them for every request."""

    snap: Snapshot
    topics: list[tuple[TopicRecord, str]]  # the topics people made (user_topics)
    consumers: list[tuple[ConsumerRecord, str]]
    producers: list[tuple[ProducerRecord, str]]


def listing(c: Console) -> Listing:
    snap = snapshot(c)
    found: Listing | None = c.cache.get("listing")
    if found is None or found.snap is not snap:
        by_name = lambda rec: rec.name  # noqa: E731
        found = c.cache["listing"] = Listing(
            snap,
            [(t, project_of(snap, t)) for t in user_topics(snap)],
            [(x, project_of(snap, x)) for x in sorted(snap.consumers.values(), key=by_name)],
            [(x, project_of(snap, x)) for x in sorted(snap.producers.values(), key=by_name)],
        )
    return found


def _visible(v: Request, records: list[tuple[T, str]]) -> list[T]:
    me = principal(v)
    if me.is_admin:
        return [rec for rec, _ in records]
    allowed: dict[str, bool] = {}
    out = []
    for rec, project in records:
        seen = allowed.get(project)
        if seen is None:
            seen = allowed[project] = me.can_view(project)
        if seen:
            out.append(rec)
    return out


def visible_topics(c: Console, v: Request) -> list[TopicRecord]:
    return _visible(v, listing(c).topics)


def visible_consumers(c: Console, v: Request) -> list[ConsumerRecord]:
    return _visible(v, listing(c).consumers)


def visible_producers(c: Console, v: Request) -> list[ProducerRecord]:
    return _visible(v, listing(c).producers)


def plain(rec: Any) -> dict[str, Any]:
    """A record as the audit log keeps it (no token hashes)."""
    values: dict[str, Any] = msgspec.to_builtins(rec)
    values.pop("token_hash", None)
    return values


def form_input(c: Console, shape: type[S], **fields: str | int | None) -> S:
    """Form fields, named as the API shape's attributes (max_priority), decoded and checked as
    the API decodes its requests (the shape, then the limits that are settings): a value the API
    refuses is refused here with the API's message, naming the API's field (maxPriority)."""
    wire = {f.name: f.encode_name for f in msgspec.structs.fields(shape)}
    value = convert({wire[name]: x for name, x in fields.items() if x is not None}, shape)
    SettingsLimits(c.settings).check(value)
    return value


def required(v: Request, name: str) -> str:
    value = v.arg(name)
    if not value:
        raise BadRequest(f"{name} is required", field=name)
    return value


class Pager(msgspec.Struct, frozen=True):
    """Where a long list is: page `page` of `pages` (from 1), `per_page` rows each."""

    page: int
    pages: int
    total: int
    per_page: int
    param: str
    query: tuple[tuple[str, str], ...]  # the page's other query arguments, kept by every link

    @property
    def first_row(self) -> int:
        return (self.page - 1) * self.per_page + 1 if self.total else 0

    @property
    def last_row(self) -> int:
        return min(self.page * self.per_page, self.total)

    def href(self, page: int | str) -> str:
        return "?" + urlencode([*self.query, (self.param, str(page))])


def paginate(v: Request, items: Sequence[T], per_page: int, param: str = "page") -> tuple[list[T], Pager]:
    """One page of `items`: the `param` argument's (a number from 1, or "last"; 1 when absent)."""
    pages = max(1, -(-len(items) // per_page))
    raw = v.arg(param)
    if raw == "last":
        page = pages
    elif not raw:
        page = 1
    elif raw.isdigit() and int(raw) >= 1:
        page = min(int(raw), pages)
    else:
        raise BadRequest(f"{param} is a page number from 1, or last", field=param)
    query = tuple((k, val) for k, values in v.query.items() if k != param for val in values)
    start = (page - 1) * per_page
    return list(items[start : start + per_page]), Pager(page, pages, len(items), per_page, param, query)


def matching(v: Request, items: Sequence[T], *fields: str) -> list[T]:
    """The items whose `fields` contain the `q` argument (all when it is empty)."""
    wanted = v.arg("q").lower()
    if not wanted:
        return list(items)
    return [x for x in items if any(wanted in str(getattr(x, f)).lower() for f in fields)]
