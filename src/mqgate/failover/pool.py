"""Named store clusters, their backends and their health (SPEC P8).

A cluster is a Redis URL (whatever `Settings.store` accepts) or `embedded:<dir>`. Each is built
into a message store, offset store and scheduler by `api.app.backends_for`, exactly as the
gateway's own store, with the gateway's other settings (prefix, broker name, fsync...).

A background task per cluster probes it every `probe_interval_s` with a cheap call bounded by
`probe_timeout_s` (Redis: a SET of one small key with a 60 s expiry, on a connection of its
own, so a server refusing writes is seen too; embedded: a stat of the data directory in a
thread, and the store's degraded conditions, e.g. the disk below its floor) and feeds the
outcome to its `core.failure_detection.Detector`; the data path reports its own operations through
`observe` or runs them through `guarded` (the send time-out). A cluster that could not be
opened (down at start-up) is opened again on its first good probe. State changes are logged
and passed to the listeners (the switch coordinator's `notice`). The broker name of a cluster
is its name unless its spec names one.

Connections of before an outage. The data path's pooled Redis connections to a cluster that
was killed and restarted are dead, and each fails at its first use: counted, those failures
would fail the cluster again right after it rejoined (a fail-back followed by a switch with
no outage). So when a cluster fails, and again when it rejoins, its idle pooled connections
are closed (the next call opens a fresh one; calls through `guarded` wait for that), and the
outcome of an operation that started before the cluster's latest rejoin is not counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec

from mqgate.backends import Backends, backends_for
from mqgate.core.failure_detection import ClusterState, DetectionRules, Detector, Outcome, Transition
from mqgate.errors import AlreadyExists, BadRequest, MqgateError, NotFound, Unavailable
from mqgate.health import Health
from mqgate.names import validate_name
from mqgate.settings import Settings
from mqgate.urls import redact

log = logging.getLogger("mqgate.failover")

EMBEDDED_PREFIX: Final = "embedded:"
T = TypeVar("T")
Listener = Callable[[Transition], None]


def now_ms() -> int:
    return int(time.time() * 1000)


class ClusterSpec(msgspec.Struct, frozen=True):
    name: str
    url: str
    pool: str = "default"
    # The broker name in its ack tokens and offset tables; default: the cluster's name, so a
    # token tells which cluster served the pull (an existing store keeps its old broker name).
    broker: str | None = None


class ClusterStatus(msgspec.Struct, frozen=True):
    """What metrics, the admin API and the log show of one cluster."""

    name: str
    url: str  # without its password
    pool: str
    state: str
    reason: str
    changed_ms: int
    opened: bool
    last_probe_ms: int
    last_probe_latency_ms: float
    last_outcome: str
    error_rate: float
    probes: int


PROBE_HISTORY: Final = 300  # probes a cluster keeps (5 minutes at the default interval)


class ProbePoint(msgspec.Struct, frozen=True):
    """One probe of a cluster: when, what it found, how long it took."""

    at_ms: int
    outcome: str
    latency_ms: float


def cluster_settings(base: Settings, spec: ClusterSpec) -> Settings:
    """The settings of a cluster: the gateway's, with the cluster's store and broker name.
    BadRequest naming `url` or `broker`."""
    url = spec.url
    broker = validate_name(spec.broker or spec.name, "broker")
    if url.startswith(EMBEDDED_PREFIX):
        directory = url[len(EMBEDDED_PREFIX) :]
        if not directory:
            raise BadRequest("an embedded cluster is 'embedded:<data directory>'", field="url")
        return dataclasses.replace(
            base, store="embedded", data_dir=Path(directory), broker_name=broker, store_process=""
        )
    settings = dataclasses.replace(base, store=url, broker_name=broker)
    if not settings.uses_redis:
        raise BadRequest(f"a cluster url is a Redis URL or 'embedded:<dir>', not {url!r}", field="url")
    _require_redis_driver()
    return settings


def _require_redis_driver() -> None:
    """redis-py comes with the `redis` extra only: checked here, with the url, so that adding a
    Redis cluster to a gateway without it is a 400 saying what to install, before the cluster
    is kept (building its backends would raise ImportError)."""
    try:
        import redis  # noqa: F401
    except ImportError as exc:
        raise BadRequest(
            f"a Redis cluster needs the Redis driver, which this gateway lacks ({exc}): "
            "pip install 'mqgate[redis]'",
            field="url",
        ) from exc


def redacted(url: str) -> str:
    if url.startswith(EMBEDDED_PREFIX):
        return url
    return redact(url)


class Cluster:
    """One store cluster: its backends, detector and probe."""

    def __init__(self, spec: ClusterSpec, settings: Settings, rules: DetectionRules, probe_timeout_s: float):
        self.spec = spec
        self.settings = settings
        self.probe_timeout_s = probe_timeout_s
        self.health = Health()
        self.backends: Backends = backends_for(settings, self.health)
        self.detector = Detector(spec.name, rules, now_ms())
        self.opened = False
        self.last_probe_ms = 0
        self.last_probe_latency_ms = 0.0
        self.last_outcome = ""
        self.probes = 0
        self.history: deque[ProbePoint] = deque(maxlen=PROBE_HISTORY)  # the latest probes, oldest first
        self._probe_client: Any = None
        # Rejoins and failures so far: an operation that started before the latest one says
        # nothing about the cluster since (a buffered answer read after a kill -9, say).
        self.generation = 0
        self._closing_idle: asyncio.Task[None] | None = None
        self._probe_key = f"{settings.redis_prefix}:failover:probe"
        if settings.uses_redis:
            from mqgate import redisio

            # A connection of its own: a probe must not queue behind the data path's calls.
            self._probe_client = redisio.connect(
                settings.store,
                socket_timeout=probe_timeout_s,
                socket_connect_timeout=probe_timeout_s,
                health_check_interval=0,
            )

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def store(self) -> Any:
        return self.backends.store

    @property
    def state(self) -> ClusterState:
        return self.detector.state

    async def open(self) -> None:
        """Start the backends (idempotent); raises when the cluster cannot be reached."""
        if self.opened:
            return
        b = self.backends
        await b.start()
        await b.store.open()
        await b.offsets.open()
        await b.scheduler.open()
        self.opened = True

    def close_idle_connections(self) -> None:
        """Close the data path's idle pooled connections (see the module doc), in a task that
        `connections_ready` waits for. Embedded clusters have none."""
        close = self.backends.close_idle_connections
        if close is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # observed outside the event loop: no connection was used there
            return
        self._closing_idle = loop.create_task(
            _close_idle(close, self._closing_idle), name=f"close-idle-{self.name}"
        )

    @property
    def closing_connections(self) -> bool:
        return self._closing_idle is not None and not self._closing_idle.done()

    async def connections_ready(self) -> None:
        """Return once a closing of idle connections under way is done."""
        closing = self._closing_idle
        if closing is not None and not closing.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(closing)

    async def close(self) -> None:
        if self._closing_idle is not None:
            with contextlib.suppress(Exception):
                await self._closing_idle
        b = self.backends
        if self.opened:
            self.opened = False
            for closing in (b.scheduler.close, b.offsets.close, b.store.close):
                with contextlib.suppress(Exception):
                    await closing()
        await b.stop()
        if self._probe_client is not None:
            await self._probe_client.aclose()

    async def probe_once(self) -> tuple[Outcome, str]:
        """One cheap call bounded by the probe time-out: its outcome and what went wrong."""
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                if self._probe_client is not None:
                    # A write, not a PING: a server that answers but refuses writes (out of
                    # memory with noeviction, a read-only replica) is not serving a producer.
                    await self._probe_client.set(self._probe_key, str(now_ms()), px=60_000)
                else:
                    await asyncio.to_thread(_stat_dir, Path(self.settings.data_dir))
                if not self.opened:
                    await self.open()  # down at start-up: now it answers
        except TimeoutError:
            return Outcome.TIMED_OUT, f"no answer within {self.probe_timeout_s:g}s"
        except Exception as exc:
            return classify(exc), f"{type(exc).__name__}: {exc}"
        degraded = self.health.degraded
        if degraded:
            return Outcome.ERROR, "; ".join(f"{k}: {v}" for k, v in degraded.items())
        return Outcome.OK, ""

    def status(self) -> ClusterStatus:
        d = self.detector
        return ClusterStatus(
            self.name,
            redacted(self.spec.url),
            self.spec.pool,
            d.state.value,
            d.reason,
            d.changed_ms,
            self.opened,
            self.last_probe_ms,
            self.last_probe_latency_ms,
            self.last_outcome,
            d.error_rate(now_ms()),
            self.probes,
        )


async def _close_idle(close: Callable[[], Awaitable[None]], before: asyncio.Task[None] | None) -> None:
    """Close the backends' idle pooled connections (`Backends.close_idle_connections`), after
    the closing `before`: in use ones are left to the call holding them."""
    if before is not None:
        with contextlib.suppress(Exception):
            await before
    try:
        await close()
    except Exception as exc:  # a connection that fails to close is gone as well
        log.debug("closing idle connections: %r", exc)


def _stat_dir(path: Path) -> None:
    st = os.stat(path)
    if not os.access(path, os.W_OK) or (st.st_mode & 0o170000) != 0o040000:
        raise PermissionError(f"{path} is not a writable directory")


def classify(exc: BaseException) -> Outcome:
    """The detector's view of an exception from a store call or a probe."""
    if isinstance(exc, TimeoutError):
        return Outcome.TIMED_OUT
    if isinstance(exc, ConnectionError | OSError) and not isinstance(exc, PermissionError):
        return Outcome.CONNECT_FAILED
    try:
        from redis import exceptions as rexc
    except ImportError:  # no Redis extra: only embedded clusters
        rexc = None  # type: ignore[assignment]
    if rexc is not None:
        if isinstance(exc, rexc.TimeoutError):
            return Outcome.TIMED_OUT
        if isinstance(exc, rexc.ConnectionError):
            return Outcome.CONNECT_FAILED
    if isinstance(exc, Unavailable):
        cause = exc.__cause__
        return classify(cause) if cause is not None else Outcome.CONNECT_FAILED
    return Outcome.ERROR


class ClusterPool:
    """Every configured cluster by name, probed in the background once started."""

    def __init__(
        self,
        base: Settings,
        rules: DetectionRules | None = None,
        *,
        probe_interval_s: float = 1.0,
        probe_timeout_s: float = 2.0,
    ) -> None:
        self.base = base
        self.rules = rules or DetectionRules()
        self.probe_interval_s = probe_interval_s
        self.probe_timeout_s = probe_timeout_s
        self._clusters: dict[str, Cluster] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._listeners: list[Listener] = []
        self._started = False

    # --- membership ----------------------------------------------------------------------

    async def add(self, spec: ClusterSpec) -> Cluster:
        """Add a cluster (BadRequest naming `name`, `url` or `pool`; AlreadyExists). Once the
        pool is started it is opened (if it answers) and probed at once."""
        validate_name(spec.name, "name")
        validate_name(spec.pool, "pool")
        if spec.name in self._clusters:
            raise AlreadyExists(f"cluster {spec.name} already exists", field="name")
        cluster = Cluster(spec, cluster_settings(self.base, spec), self.rules, self.probe_timeout_s)
        self._clusters[spec.name] = cluster
        if self._started:
            await self._start_one(cluster)
        return cluster

    async def remove(self, name: str) -> None:
        cluster = self.get(name)
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        del self._clusters[name]
        await cluster.close()

    def get(self, name: str) -> Cluster:
        cluster = self._clusters.get(name)
        if cluster is None:
            raise NotFound(f"no cluster named {name!r}", field="cluster")
        return cluster

    def clusters(self) -> list[Cluster]:
        return list(self._clusters.values())

    def names(self, pool: str | None = None) -> list[str]:
        return sorted(n for n, c in self._clusters.items() if pool is None or c.spec.pool == pool)

    def states(self) -> dict[str, ClusterState]:
        return {n: c.state for n, c in self._clusters.items()}

    def statuses(self) -> list[ClusterStatus]:
        return [self._clusters[n].status() for n in self.names()]

    def listen(self, listener: Listener) -> None:
        """Call `listener` with every state change (on the event loop)."""
        self._listeners.append(listener)

    # --- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self._started = True
        for cluster in list(self._clusters.values()):
            await self._start_one(cluster)

    async def _start_one(self, cluster: Cluster) -> None:
        try:
            await cluster.open()
        except (MqgateError, OSError) as exc:
            self._record(cluster, classify(exc), f"not opened: {exc}")
        self._tasks[cluster.name] = asyncio.get_running_loop().create_task(
            self._probe_loop(cluster), name=f"probe-{cluster.name}"
        )

    async def stop(self) -> None:
        self._started = False
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for cluster in self._clusters.values():
            await cluster.close()

    async def _probe_loop(self, cluster: Cluster) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            outcome, detail = await cluster.probe_once()
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                # Stopped while probing, and the client turned the cancellation into an error
                # (redis-py may): the stop waits for this task, so it ends here.
                raise asyncio.CancelledError
            cluster.probes += 1
            cluster.last_probe_ms = now_ms()
            cluster.last_probe_latency_ms = (loop.time() - started) * 1000
            self._record(cluster, outcome, detail)
            cluster.history.append(
                ProbePoint(cluster.last_probe_ms, outcome.value, cluster.last_probe_latency_ms)
            )
            # A probe that timed out has used its interval already.
            await asyncio.sleep(max(0.0, self.probe_interval_s - (loop.time() - started)))

    # --- the data path's observations ----------------------------------------------------

    def observe(self, name: str, outcome: Outcome, seconds: float = 0.0, detail: str = "") -> None:
        """Account an operation of the data path (its outcome and how long it took)."""
        cluster = self.get(name)
        self._record(cluster, self.rules.classify_duration(outcome, seconds), detail)

    async def guarded(self, name: str, operation: Callable[[], Awaitable[T]]) -> T:
        """Run a store call on cluster `name` within the send time-out and account its outcome;
        a time-out raises `Unavailable` (the caller spools or retries elsewhere)."""
        cluster = self.get(name)
        if cluster.closing_connections:
            await cluster.connections_ready()  # no call on a connection of before the outage
        generation = cluster.generation
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(self.rules.send_timeout_s):
                result = await operation()
        except TimeoutError as exc:
            if cluster.generation == generation:
                self._record(cluster, Outcome.TIMED_OUT, f"operation over {self.rules.send_timeout_s:g}s")
            raise Unavailable(
                f"cluster {name} did not answer within {self.rules.send_timeout_s:g}s (send timeout)"
            ) from exc
        except Exception as exc:
            outcome = classify(exc)
            if isinstance(exc, MqgateError) and not isinstance(exc, Unavailable) and exc.http_status < 500:
                outcome = Outcome.OK  # the request's own fault (bad input), not the cluster's
            if cluster.generation == generation:
                self._record(cluster, outcome, str(exc))
            else:  # started before the cluster failed or rejoined (on a connection of before, maybe)
                log.info("cluster %s: not counted, started before it failed or rejoined: %s", name, exc)
            raise
        if cluster.generation == generation:
            self._record(cluster, self.rules.classify_duration(Outcome.OK, loop.time() - started), "")
        return result

    def _record(self, cluster: Cluster, outcome: Outcome, detail: str) -> None:
        cluster.last_outcome = outcome.value
        change = cluster.detector.observe(outcome, now_ms(), detail)
        if change is None:
            return
        rejoined = change.after is ClusterState.HEALTHY and change.before in (
            ClusterState.FAILED,
            ClusterState.RECOVERING,
        )
        if rejoined or change.after is ClusterState.FAILED:
            cluster.generation += 1
            cluster.close_idle_connections()
        level = (
            logging.INFO
            if change.after in (ClusterState.HEALTHY, ClusterState.RECOVERING)
            else logging.WARNING
        )
        log.log(
            level, "cluster %s: %s -> %s (%s)", change.cluster, change.before, change.after, change.reason
        )
        for listener in self._listeners:
            try:
                listener(change)
            except Exception:
                log.exception("cluster state listener failed")
