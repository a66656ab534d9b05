"""The figures a generated trace must produce, computed with numpy from the generator's
arrays (no Spark, no JSON): what the tests and the benchmark hold the report to."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mqgate.analytics.generator import (
    ERROR_TYPES,
    GATEWAYS,
    HOPS,
    NODES,
    TOPICS,
    LoadTrace,
    client_name,
    hop_code,
)
from mqgate.analytics.reports import COUNTED_HOPS, MINUTE_MS, SUSTAINED_MINUTES
from mqgate.analytics.tracefile import msg_id


@dataclass
class Truth:
    counts: dict[str, dict[str, int]]  # "all" and each project -> figure -> value
    per_minute: dict[int, dict[str, int]]
    per_hour: dict[int, dict[str, int]]
    capacity: dict[tuple[str, str], dict[str, float]]
    latency: dict[str, dict[str, np.ndarray]]  # topic -> hop -> sorted latencies
    slowest: list[tuple[int, str]]  # (end to end ms, msgId), slowest first
    faults: dict[str, dict[str, Any]] = field(default_factory=dict)


def _in_window(time: np.ndarray, from_ms: int | None, to_ms: int | None) -> np.ndarray:
    keep = np.ones(len(time), dtype=bool)
    if from_ms is not None:
        keep &= time >= from_ms
    if to_ms is not None:
        keep &= time < to_ms
    return keep


def _count(hop: np.ndarray, name: str, mine: np.ndarray) -> int:
    if name not in HOPS:  # a hop the generator never writes (released)
        return 0
    return int(((hop == hop_code(name)) & mine).sum())


def compute(
    trace: LoadTrace, from_ms: int | None = None, to_ms: int | None = None, slowest: int = 20
) -> Truth:
    ev = trace.events
    keep = _in_window(ev.time, from_ms, to_ms)
    hop, time, topic = ev.hop[keep], ev.time[keep], ev.topic[keep]
    error = ev.error_type[keep] >= 0
    project_of_topic = np.array([t[0] for t in TOPICS])
    counts: dict[str, dict[str, int]] = {}
    for project in ("all", *sorted({t[0] for t in TOPICS})):
        mine = np.ones(len(hop), dtype=bool) if project == "all" else project_of_topic[topic] == project
        figures = {name: _count(hop, h, mine) for name, h in COUNTED_HOPS.items()}
        figures["failed"] = int((error & mine).sum())
        figures["events"] = int(mine.sum())
        counts[project] = figures

    minute = time // MINUTE_MS
    series = {
        "accepted": hop == hop_code("accepted"),
        "delivered": (hop == hop_code("delivered")) & ~error,
        "acked": (hop == hop_code("acked")) & ~error,
        "errors": error,
    }
    per_minute: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(series, 0))
    per_hour: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(series, 0))
    for name, mask in series.items():
        ms, n = np.unique(minute[mask], return_counts=True)
        for m, c in zip(ms.tolist(), n.tolist(), strict=True):
            per_minute[m * MINUTE_MS][name] += c
            per_hour[m * MINUTE_MS // 3_600_000 * 3_600_000][name] += c

    capacity: dict[tuple[str, str], dict[str, float]] = {}
    gw, client = ev.gateway[keep], ev.client[keep]
    roles: list[tuple[str, np.ndarray, np.ndarray, list[str]]] = [
        ("producer", hop == hop_code("accepted"), topic, [t[2] for t in TOPICS]),
        ("consumer", hop == hop_code("acked"), topic, [t[3] for t in TOPICS]),
        (
            "client",
            hop == hop_code("acked"),
            topic * 2 + client,
            [client_name(t, c) for t in range(3) for c in range(2)],
        ),
        (
            "gateway",
            np.isin(hop, [hop_code(h) for h in ("accepted", "delivered", "acked")]),
            gw,
            list(GATEWAYS),
        ),
    ]
    for role, mask, code, names in roles:
        for k, name in enumerate(names):
            mins = minute[mask & (code == k)]
            if not len(mins):
                continue
            _, per = np.unique(mins, return_counts=True)
            _, per10 = np.unique(mins // SUSTAINED_MINUTES, return_counts=True)
            capacity[(role, name)] = {
                "events": len(mins),
                "peakPerS": round(int(per.max()) / 60, 3),
                "sustainedPerS": round(int(per10.max()) / (SUSTAINED_MINUTES * 60), 3),
            }

    return Truth(
        counts,
        dict(per_minute),
        dict(per_hour),
        capacity,
        *_latency(trace, keep, slowest),
        faults=_faults(trace, keep),
    )


def _latency(
    trace: LoadTrace, keep: np.ndarray, top: int
) -> tuple[dict[str, dict[str, np.ndarray]], list[tuple[int, str]]]:
    ev = trace.events
    n = len(trace.topic)
    msg, hop, time = ev.msg[keep], ev.hop[keep], ev.time[keep]

    def at(h: str, first: bool) -> np.ndarray:
        out = np.full(n, np.iinfo(np.int64).max if first else -1, dtype=np.int64)
        sel = hop == hop_code(h)
        (np.minimum if first else np.maximum).at(out, msg[sel], time[sel])
        return np.where(out == np.iinfo(np.int64).max, -1, out)

    a, s, d1, dn, k = (
        at("accepted", True),
        at("stored", True),
        at("delivered", True),
        at("delivered", False),
        at("acked", False),
    )
    pairs = {"store": (s, a), "deliver": (d1, s), "process": (k, dn), "endToEnd": (k, a)}
    out: dict[str, dict[str, np.ndarray]] = {}
    for t, spec in enumerate(TOPICS):
        mine = trace.topic == t
        out[spec[1]] = {}
        for h, (later, earlier) in pairs.items():
            ok = mine & (later >= 0) & (earlier >= 0)
            out[spec[1]][h] = np.sort(later[ok] - earlier[ok])
    done = (k >= 0) & (a >= 0)
    e2e = np.where(done, k - a, -1)
    order = np.lexsort((np.arange(n), -e2e))[:top]
    return out, [(int(e2e[i]), msg_id(int(i))) for i in order if e2e[i] >= 0]


def _faults(trace: LoadTrace, keep: np.ndarray) -> dict[str, dict[str, Any]]:
    """Each injected fault as the report must localise it: type, node, services, queues,
    failure count and the first failure's time."""
    ev = trace.events
    out: dict[str, dict[str, Any]] = {}
    for name, etype in (
        ("failing gateway", "unavailable"),
        ("dead queue", "ttl"),
        ("slow consumer", "lock_expired"),
    ):
        sel = keep & (ev.error_type == ERROR_TYPES.index(etype))
        if not sel.any():
            continue
        nodes = {NODES[i] for i in np.unique(ev.error_node[sel])}
        topics = np.unique(ev.topic[sel])
        services = {TOPICS[t][3] if ev.has_consumer[sel][0] else TOPICS[t][2] for t in topics.tolist()}
        queues = {
            (TOPICS[t][0], TOPICS[t][1], int(q))
            for t, q in zip(ev.topic[sel].tolist(), ev.queue[sel].tolist(), strict=True)
            if q >= 0
        }
        out[name] = {
            "type": etype,
            "nodes": nodes,
            "services": services,
            "queues": queues,
            "count": int(sel.sum()),
            "firstMs": int(ev.time[sel].min()),
        }
    return out
