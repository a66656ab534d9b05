"""Pages of the admin API's lists (issue 27; docs/PROTOCOL.md, "Paging").

Every list that can grow without bound is answered in pages: at most `limit` items (`PageIn`,
at most `MAX_PAGE_ITEMS`), stopping before their encoded bytes pass `max_answer_bytes` (at least
one item: `core/budget.py`, the rule a pull's messages follow too), in the order of a key that
names each item once. A page that stopped early carries `next`, an opaque cursor: the key of its
last item, and a tag of the list and of the query's other parameters, so a cursor is taken back
only by the query that gave it. The next request passes it as `cursor` and the list goes on after
that key, so an item added or removed between pages moves no other item: none is answered twice
or skipped. A cursor that is not one the call gave (not base64url, not the key's shape, another
list's or another query's) is refused with 400 naming `cursor`.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Annotated, Any, Final, TypeVar

import msgspec
from msgspec import Meta

from mqgate.api.shapes import MAX_EPOCH_MS, PageIn
from mqgate.core.budget import within_budget
from mqgate.errors import BadRequest

T = TypeVar("T")
R = TypeVar("R")

# The parts a cursor's key may hold: a name (topic, consumer, clientId, ...) or a number (a
# queue, a time, a position), within bounds so that a made-up cursor cannot reach a query as
# something the database refuses.
KeyText = Annotated[str, Meta(max_length=512)]
KeyInt = Annotated[int, Meta(ge=-1, le=MAX_EPOCH_MS)]
NAME_KEY: Final = (KeyText,)

_TAG_BYTES: Final = 6
_PAGING_FIELDS: Final = frozenset({"limit", "cursor"})
_encode = msgspec.json.Encoder().encode
_decoders: dict[tuple[Any, ...], msgspec.json.Decoder[Any]] = {}
_REFUSED: Final = "cursor is not one this list gave: pass back the previous page's `next` as it was"
_OTHER_QUERY: Final = (
    "cursor was given by another list or with other parameters: pass it back with the same ones"
)


def _tag(inp: PageIn, kind: str) -> str:
    """The list and the query's other parameters (its filters), as a cursor carries them."""
    filters = {f: getattr(inp, f) for f in inp.__struct_fields__ if f not in _PAGING_FIELDS}
    digest = hashlib.blake2b(kind.encode() + b"\0" + _encode(filters), digest_size=_TAG_BYTES).digest()
    return base64.urlsafe_b64encode(digest).decode()


def _decoder(key: tuple[Any, ...]) -> msgspec.json.Decoder[Any]:
    found = _decoders.get(key)
    if found is None:
        shape: Any = tuple.__class_getitem__((str, *key))
        found = _decoders[key] = msgspec.json.Decoder(shape)
    return found


def _item_size(item: Any) -> int:
    return len(_encode(item)) + 1  # its JSON and the comma before the next


def _size(pair: tuple[Any, Any]) -> int:
    return _item_size(pair[1])


class Paging:
    """The pages of one gateway's lists, within its answer budget (`max_answer_bytes`)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget

    def after(self, inp: PageIn, kind: str, key: tuple[Any, ...] = NAME_KEY) -> tuple[Any, ...] | None:
        """The key of the previous page's last item, from `inp.cursor` (None: the first page).
        `key`: the types of the key's parts."""
        if inp.cursor is None:
            return None
        try:
            raw = base64.b64decode(inp.cursor + "=" * (-len(inp.cursor) % 4), altchars=b"-_", validate=True)
            tag, *position = _decoder(key).decode(raw)
        except (binascii.Error, ValueError, msgspec.MsgspecError) as exc:
            raise BadRequest(_REFUSED, field="cursor") from exc
        if tag != _tag(inp, kind):
            raise BadRequest(_OTHER_QUERY, field="cursor")
        return tuple(position)

    def cursor(self, inp: PageIn, kind: str, last: tuple[Any, ...]) -> str:
        """The cursor of the page after the item keyed `last`."""
        raw = _encode([_tag(inp, kind), *last])
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def page(
        self, inp: PageIn, kind: str, keyed: Iterable[tuple[tuple[Any, ...], T]], *, more: bool = False
    ) -> tuple[list[T], str | None]:
        """The first of `keyed` ((key, item) in key order, after the cursor's key) that fit the
        page, and the cursor of the next page (None: nothing is left). `more`: items follow
        those of `keyed` (a source that read only so far)."""
        taken, left = within_budget(keyed, self.budget, _size, inp.limit)
        items = [item for _, item in taken]
        if not taken or not (left or more):
            return items, None
        return items, self.cursor(inp, kind, taken[-1][0])

    def fitting(self, items: Iterable[T], limit: int) -> list[T]:
        """The first of `items` (at most `limit`) within the budget, at least one: a bounded
        list inside an answer that is not itself a page."""
        taken, _ = within_budget(items, self.budget, _item_size, limit)
        return taken

    def listing(
        self,
        inp: PageIn,
        kind: str,
        records: Iterable[R],
        key: Callable[[R], tuple[Any, ...]],
        shape: Callable[[R], T],
        key_types: tuple[Any, ...] = NAME_KEY,
    ) -> tuple[list[T], str | None]:
        """A page of records held in memory (the registry's, say): ordered by `key`, those
        after the cursor's, each as its answer `shape` (made only for the page's items)."""
        ordered = sorted(records, key=key)
        return self.page(inp, kind, _keyed(ordered, key, shape, self.after(inp, kind, key_types)))


def _keyed(
    ordered: Sequence[R], key: Callable[[R], tuple[Any, ...]], shape: Callable[[R], T], after: Any
) -> Iterator[tuple[tuple[Any, ...], T]]:
    start = 0 if after is None else bisect.bisect_right(ordered, after, key=key)
    for record in ordered[start:]:
        yield key(record), shape(record)
