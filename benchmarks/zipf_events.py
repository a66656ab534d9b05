"""Like and comment events on videos with Zipf-distributed (or uniform) video ids.

Shared by the pipeline tests and benchmarks/pipeline_bench.py. Likes are one JSON object per
message (format json); comments are JSON arrays of 1-4 comments per message (format batch).
Video `v1` is the most popular under Zipf. The generator returns the exact totals per
(type, video) that the pipeline's tables must end up with.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

BATCH = 1000


@dataclass
class Workload:
    likes: list[dict[str, Any]] = field(default_factory=list)
    comments: list[dict[str, Any]] = field(default_factory=list)
    totals: Counter[tuple[str, str]] = field(default_factory=Counter)

    @property
    def events(self) -> int:
        return sum(self.totals.values())

    def hottest(self) -> tuple[str, int]:
        per_key: Counter[str] = Counter()
        for (_, key), n in self.totals.items():
            per_key[key] += n
        return per_key.most_common(1)[0]


def key_sampler(keys: int, zipf_s: float | None, rng: random.Random) -> Any:
    """A function drawing a video id: Zipf(s) over `keys` ranks, or uniform when s is None."""
    names = [f"v{i}" for i in range(1, keys + 1)]
    if zipf_s is None:
        return lambda: rng.choice(names)
    cum = list(itertools.accumulate(1.0 / (k**zipf_s) for k in range(1, keys + 1)))
    return lambda: rng.choices(names, cum_weights=cum)[0]


def generate(
    events: int, keys: int = 1000, zipf_s: float | None = 1.2, like_share: float = 0.6, seed: int = 7
) -> Workload:
    """About `events` events (exactly, counting comment items), `like_share` of them likes."""
    rng = random.Random(seed)
    draw = key_sampler(keys, zipf_s, rng)
    w = Workload()
    n_likes = int(events * like_share)
    for i in range(n_likes):
        video = draw()
        body = {"video_id": video, "user_id": f"u{rng.randrange(100_000)}", "ts": 1_700_000_000_000 + i}
        w.likes.append({"message": json.dumps(body)})
        w.totals[("like", video)] += 1
    left = events - n_likes
    while left > 0:
        n = min(left, rng.randint(1, 4))
        items = []
        for _ in range(n):
            video = draw()
            items.append({"video_id": video, "user_id": f"u{rng.randrange(100_000)}", "text": "nice!"})
            w.totals[("comment", video)] += 1
        w.comments.append({"message": json.dumps(items)})
        left -= n
    return w


def produce(
    url: str, token: str, producer: str, messages: Sequence[dict[str, Any]], threads: int = 4
) -> None:
    """Batch-produce `messages` (1,000 per call) with a few concurrent connections."""
    batches = [messages[i : i + BATCH] for i in range(0, len(messages), BATCH)]

    def send(batch: Sequence[dict[str, Any]]) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            r = http.post(
                "/mq/produce/batch",
                json={"producer": producer, "messages": list(batch)},
                headers={"Authorization": f"Bearer {token}"},
            )
            if r.status_code != 200:
                raise RuntimeError(f"produce failed: HTTP {r.status_code}: {r.text[:300]}")

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(send, batches))
