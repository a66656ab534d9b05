"""Content kept by reference (info and error, where the mode records queue and offset): the
trace holds no copy of the body, the path query reads it from the store while the message is
stored, and leaves it out once retention removed it or the offset holds another message."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mqgate.core.ids import new_message_ids
from mqgate.model import StoredMessage
from mqgate.store.interface import MessageStore, TopicConfig
from mqgate.tracing.batch import TraceBatch, encode_batch, expand
from mqgate.tracing.lookup import TraceLookup
from mqgate.tracing.paths import build_path
from mqgate.tracing.policy import CONTENT_REF, Level, Mode, content_by_reference, recorded_fields
from tests.tracing.conftest import GATEWAY, Stores, event, run_with_small_segments


def kept(modes: list[Mode], level: Level) -> frozenset[str]:
    return content_by_reference(recorded_fields(modes, level), level)


def test_content_is_kept_by_reference_where_the_record_holds_the_message_s_address() -> None:
    for mode in (Mode.PROJECT, Mode.QUEUE):
        for level in (Level.INFO, Level.ERROR):
            fields = kept([mode], level)
            assert CONTENT_REF in fields and "body" not in fields, (mode, level)
        # Debug keeps a copy, which outlives the message.
        debug = kept([mode], Level.DEBUG)
        assert "body" in debug and CONTENT_REF not in debug
    # A route trace records no queue: it has no address to point at, so it keeps a copy.
    route = kept([Mode.ROUTE], Level.INFO)
    assert "body" in route and CONTENT_REF not in route and "queue" not in route
    # A service trace keeps no content below debug at all.
    service = kept([Mode.SERVICE], Level.INFO)
    assert "body" not in service and CONTENT_REF not in service
    # Route and service together record the queue and offset: by reference.
    both = kept([Mode.ROUTE, Mode.SERVICE], Level.INFO)
    assert CONTENT_REF in both and "body" not in both


def _batch(content_ref: bool, bodies: list[str | None]) -> TraceBatch:
    return TraceBatch(
        kind="batch",
        hops=["accepted", "stored"],
        time_ms=1_000,
        last_ms=1_002,
        project="shop",
        topic="orders",
        resource=GATEWAY,
        msg_ids=["m0", "m1"],
        queue=1,
        first_offset=7,
        bodies=bodies,
        content_ref=content_ref,
    )


def test_a_batch_by_reference_holds_no_body_and_its_stored_hops_point_at_the_messages() -> None:
    by_ref, copied = _batch(True, []), _batch(False, ["body zero", "body one"])
    assert b"body zero" not in encode_batch(by_ref) and b"body zero" in encode_batch(copied)
    assert b'"contentRef":true' in encode_batch(by_ref) and b"contentRef" not in encode_batch(copied)
    events = expand(by_ref)
    stored = [e for e in events if e.hop == "stored"]
    assert [(e.queue, e.offset, e.content_ref, e.body) for e in stored] == [
        (1, 7, True, None),
        (1, 8, True, None),
    ]
    assert not any(e.content_ref for e in events if e.hop == "accepted")  # no offset yet
    assert all(not e.content_ref and e.body is not None for e in expand(copied) if e.hop == "stored")


def _lookup(store: MessageStore, body_max_bytes: int) -> TraceLookup:
    # Only the store and the body bound are used to read referenced content.
    ctx: Any = SimpleNamespace(store=store, settings=SimpleNamespace(trace_body_max_bytes=body_max_bytes))
    return TraceLookup(ctx, None, None)  # type: ignore[arg-type]


def _path(msg_id: str, offset: int) -> Any:
    return build_path(
        msg_id,
        [
            event(msg_id, "accepted", 1),
            event(msg_id, "stored", 2, queue=0, offset=offset, content_ref=True),
            event(msg_id, "delivered", 3, queue=0, offset=offset, content_ref=True, consumer="c"),
        ],
    )


def test_the_path_query_reads_referenced_content_from_the_store_while_it_is_there(tmp_path: Path) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        await store.create_topic(TopicConfig("orders", 1, 1))  # retention 1 ms: gone when enforced
        ids = new_message_ids(1, 3)
        msgs = [
            StoredMessage(i, 1, "p", f"content of {n} " + "é" * 10, [], [], {}) for n, i in enumerate(ids)
        ]
        assert await store.append("orders", 0, msgs) == 0
        lookup = _lookup(store, body_max_bytes=20)

        path = await lookup._with_content(_path(ids[1], 1))
        hops = {h.hop: h for h in path.hops}
        # Cut to the configured size like a copy, on a character boundary; on the first hop
        # that points at it only.
        assert hops["stored"].body == "content of 1 ééé" and hops["stored"].content_ref
        assert hops["delivered"].body is None and hops["accepted"].body is None
        # An offset that holds another message gives no body (never another message's).
        mismatch = await lookup._with_content(_path(ids[1], 2))
        assert all(h.body is None for h in mismatch.hops)
        # Once retention removed the message, the path has no body.
        for n in range(4):  # roll segments, so the message's segment can go
            await store.append("orders", 0, [StoredMessage(f"later{n}", 2, "p", "x" * 2000, [], [], {})])
        await store.enforce_retention(now_ms=2**62)
        assert (await store.bounds("orders"))[0].min > 1
        gone = await lookup._with_content(_path(ids[1], 1))
        assert all(h.body is None for h in gone.hops)

    run_with_small_segments(tmp_path / "data", body)
