"""mqgate.client and the errors of docs/PROTOCOL.md: each documented (status, code) becomes its
mqgate.errors class, and a 507 (the disk at its free-space floor, on a real gateway) is tried
again after its Retry-After within the client's retry budget, then raised as
InsufficientStorage once the budget is spent."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import httpx
import msgspec
import pytest

from mqgate.client import Client, error_from_answer, transport
from mqgate.errors import (
    AlreadyExists,
    BadRequest,
    Conflict,
    CorruptRecord,
    Forbidden,
    InsufficientStorage,
    MethodNotAllowed,
    MqgateError,
    NotFound,
    PayloadTooLarge,
    StorageError,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
)
from tests.conftest import ROOT, Server
from tests.durable.test_storage_faults import MIB, gateway, small_disk  # noqa: F401 (a fixture, used below)

# docs/PROTOCOL.md's error table, (status, code) -> the class a client raises.
CLASSES: dict[tuple[int, str | None], type[MqgateError]] = {
    (400, "bad_request"): BadRequest,
    (400, "bad_handle"): BadRequest,
    (401, "unauthorized"): Unauthorized,
    (403, "forbidden"): Forbidden,
    (404, "not_found"): NotFound,
    (404, "no_route"): NotFound,
    (404, "half_message_gone"): NotFound,
    (405, "method_not_allowed"): MethodNotAllowed,
    (408, "bad_request"): BadRequest,
    (409, "already_exists"): AlreadyExists,
    (409, "lock_expired"): Conflict,
    (409, "lock_taken"): Conflict,
    (409, "offset_moved"): Conflict,
    (409, "already_acked"): Conflict,
    (409, "already_redriven"): Conflict,
    (409, "redrive_busy"): Conflict,
    (409, "no_redrive"): Conflict,
    (409, "already_decided"): Conflict,
    (409, "in_use"): Conflict,
    (409, "conflict"): Conflict,
    (413, "too_large"): PayloadTooLarge,
    (415, "unsupported_media_type"): UnsupportedMediaType,
    (429, None): Unavailable,
    (431, "bad_request"): BadRequest,
    (500, "corrupt_record"): CorruptRecord,
    (500, "internal"): MqgateError,
    (503, "unavailable"): Unavailable,
    (503, "storage"): StorageError,
    (507, "disk_full"): InsufficientStorage,
}
FLOOR = 8 * MIB


def documented_codes() -> set[tuple[int, str | None]]:
    text = (ROOT / "docs" / "PROTOCOL.md").read_text()
    table = text.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    found: set[tuple[int, str | None]] = set()
    for status, codes in re.findall(r"^\| (\d{3}) \| ([^|]*) \|", table, re.M):
        named = re.findall(r"`([a-z_]+)`", codes.split("(field")[0])
        found |= {(int(status), code) for code in named} if named else {(int(status), None)}
    return found


def test_every_documented_error_code_maps_to_its_class() -> None:
    assert documented_codes() == set(CLASSES)
    for (status, code), cls in CLASSES.items():
        body = msgspec.json.encode({"status": status, "message": "m", "result": {"code": code, "field": "f"}})
        exc = error_from_answer(status, body, "3")
        assert type(exc) is cls, (status, code, exc)
        assert (exc.http_status, exc.code, exc.field, exc.retry_after_s) == (status, code or cls.code, "f", 3)


class Clock:
    """The transport's clock: a sleep passes at once (after `on_sleep`), and is kept."""

    def __init__(self, on_sleep: Callable[[], None] = lambda: None) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self.on_sleep = on_sleep

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        self.on_sleep()


def refusals(srv: Server) -> int:
    """How many writes the gateway refused below its floor (each attempt of a client)."""
    faults = httpx.get(srv.url + "/healthz", timeout=10).json()["result"]["faults"]
    refused = ("disk", "write_refused_below_floor")
    return sum(f["count"] for f in faults if (f["component"], f["kind"]) == refused)


def below_the_floor(disk: Path) -> tuple[Server, Path]:
    """A gateway on `disk` with producer `t-p` of topic `t`, its free space just under its floor."""
    srv = gateway(disk, floor=FLOOR).start()
    srv.setup_topic("t", queues=1)
    ballast = disk / "ballast"
    ballast.write_bytes(b"\0" * (shutil.disk_usage(disk).free - FLOOR + MIB))
    return srv, ballast


def test_a_507_is_tried_again_after_its_retry_after_and_then_stored(
    small_disk: Path,  # noqa: F811 (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    srv, ballast = below_the_floor(small_disk)
    try:
        clock = Clock(on_sleep=ballast.unlink)  # space is freed while the client waits
        monkeypatch.setattr(transport, "time", clock)
        with Client(srv.url, srv.admin_token, retry_for_s=30) as client:
            assert client.produce("t-p", [{"message": "after the wait"}]) == 1
        assert clock.slept == [5.0]  # the gateway's Retry-After, not the client's first backoff
        assert refusals(srv) == 1
        with Client(srv.url, srv.admin_token) as client:
            assert [b.max for b in client.bounds("t")[1]] == [1]
    finally:
        srv.stop()


def test_a_507_past_the_retry_budget_is_insufficient_storage(
    small_disk: Path,  # noqa: F811 (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    srv, _ = below_the_floor(small_disk)
    try:
        for budget, waits in ((12.0, [5.0, 5.0]), (4.0, []), (0.0, [])):
            clock = Clock()
            monkeypatch.setattr(transport, "time", clock)
            before = refusals(srv)
            with (
                Client(srv.url, srv.admin_token, retry_for_s=budget) as client,
                pytest.raises(InsufficientStorage) as refused,
            ):
                client.produce("t-p", [{"message": "never stored"}])
            assert clock.slept == waits  # no attempt that could not come after the Retry-After
            assert refusals(srv) - before == len(waits) + 1
            exc = refused.value
            assert (exc.http_status, exc.code, exc.retry_after_s) == (507, "disk_full", 5.0)
            assert "disk_free_floor_bytes" in exc.message
    finally:
        srv.stop()
