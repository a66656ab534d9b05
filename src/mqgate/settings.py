"""All configuration in one dataclass, loadable from a TOML file and `MQGATE_*` variables.

Precedence: defaults < TOML file < environment < explicit overrides (CLI flags).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from mqgate.core.failure_detection import DetectionRules
from mqgate.errors import BadRequest
from mqgate.names import validate_name

KIB: Final = 1024
MIB: Final = 1024 * KIB
ENV_PREFIX: Final = "MQGATE_"
# Set by `mqgate serve --workers N` on the embedded store for its workers: the store process's socket.
STORE_PROCESS_ENV: Final = ENV_PREFIX + "STORE_PROCESS"
REDIS_SCHEMES: Final = ("redis://", "rediss://", "unix://", "redis+cluster://", "redis+sentinel://")
MAX_WORKERS: Final = 64


@dataclass(slots=True)
class Settings:
    # Where the gateway listens: its address (0.0.0.0: every interface) and TCP port.
    host: str = "127.0.0.1"
    port: int = 8080
    # This gateway's own files: the embedded store's logs and offsets, the SQLite registry and
    # indexes (unless elsewhere), admin.token, secret.key, the failover spool.
    data_dir: Path = field(default_factory=lambda: Path("data"))
    # "always": a produce or ack is answered after fsync (group commit);
    # "interval:<ms>": fsync at most every <ms>; a crash may lose that window.
    fsync: str = "always"
    # Where messages and consumer offsets live: "embedded" (files in data_dir, one gateway
    # process) or a Redis URL such as "redis://host:6379/0" (any number of gateways).
    store: str = "embedded"
    # Prefix of every Redis key, so several mqgate clusters can share one Redis.
    redis_prefix: str = "mq"
    # A produce (append or hold) and an ack are answered only once this many replicas of the
    # Redis primary have them (WAIT), so a failover cannot lose them; 0 = do not wait.
    # Not confirmed within redis_wait_timeout_ms: 503 (the write may or may not survive).
    redis_wait_replicas: int = 0
    redis_wait_timeout_ms: int = 1000
    # SQLAlchemy URL of the registry; empty means an SQLite file in the data directory.
    # Gateways on several machines share one registry: use PostgreSQL.
    registry: str = ""
    # Gateway processes `mqgate serve` starts on one port. On the embedded store, more than one
    # runs beside a store process that owns the data directory's files (docs/WORKERS.md).
    workers: int = 1
    # Empty means: generate one on first start and keep it in <data_dir>/admin.token.
    admin_token: str = ""
    # If set, GET /metrics needs "Authorization: Bearer <metrics_token>"; empty = open.
    metrics_token: str = ""
    # The console's reverse proxies (comma-separated addresses or CIDR blocks): only a request
    # from one of them has its client address taken from X-Forwarded-For (the rightmost address
    # none of them holds), for the sign-in limit per address. Empty: trust none, use the peer.
    console_trusted_proxies: str = ""
    # The most requests of a role in progress at once (0: no limit); one more is answered 429
    # with Retry-After: admin calls, log reads (the reader role), and the console's pages. The
    # data path (produce, pull, ack) is bounded by its body and answer limits instead.
    max_concurrent_admin_requests: int = 32
    max_concurrent_read_requests: int = 32
    console_max_concurrent_requests: int = 32
    # The console's sign-in limit: failed sign-ins allowed per user name (known or not) and per
    # client address within a window, after which that name or address waits out the window.
    console_signin_failures_per_user: int = 5
    console_signin_failures_per_ip: int = 20
    console_signin_window_s: float = 900.0
    # Key for signing ack tokens; empty means generated once into <data_dir>/secret.key.
    token_secret: str = ""
    # The store's name in ack tokens and receipts (`broker`): an ack goes to the store it names.
    broker_name: str = "local"
    # A queue's log (and the failover spool) is written in files of this size; retention
    # removes whole files.
    segment_bytes: int = 64 * MIB
    # Defaults of a topic or consumer created without them: a topic's queues, how long a pulled
    # batch stays locked (then it is delivered again), deliveries before a message is
    # dead-lettered, how long a topic keeps its messages.
    default_queues: int = 8
    default_lock_timeout_s: float = 60.0
    default_max_attempts: int = 16
    default_retention_ms: int = 7 * 24 * 3600 * 1000
    # A broadcast consumer's client (clientId) unseen this long is removed with its offsets.
    broadcast_client_ttl_s: float = 24 * 3600.0
    # A gateway reads the registry again at least this often (changes another gateway made).
    registry_refresh_s: float = 5.0
    # How often the gateway removes what retention no longer keeps.
    retention_check_s: float = 30.0
    # The embedded store checkpoints each queue written since its last checkpoint this often
    # (a shorter recovery after a crash).
    checkpoint_interval_s: float = 5.0
    # With fsync=always, the embedded store's round journal holds each round's records until the
    # queue files are fsynced together (a settle), about this often (store/backends/embedded/journal.py).
    journal_settle_interval_s: float = 1.0
    # Below this much free space on the data directory's file system, new messages are refused
    # (507) until space returns (like RabbitMQ's disk_free_limit); acks go on. 0 turns it off.
    disk_free_floor_bytes: int = 64 * MIB
    # The data path's limits: a message's body, a request's body, a batch's messages and bytes,
    # the messages one pull answers.
    max_message_bytes: int = 1 * MIB
    max_request_bytes: int = 5 * MIB
    max_batch_messages: int = 1000
    max_batch_bytes: int = 4 * MIB
    max_pull_messages: int = 1024
    # The messages of one read-by-offset answer (GET /mq/read, /mq/browse) stop at this many
    # bytes (at least one message): its `next` is where to go on.
    max_answer_bytes: int = 8 * MIB
    # The longest a pull (or a receive) may wait for messages to arrive (long polling).
    max_wait_s: float = 30.0
    # A request's line and headers must arrive within this time (408), be at most this many
    # header fields and bytes (431): slow or oversized headers cannot hold connections.
    header_timeout_s: float = 10.0
    max_header_count: int = 100
    max_header_bytes: int = 64 * KIB
    # The gateway's log level: debug, info, warning or error.
    log_level: str = "info"
    # Tracing (SPEC P2-P6): a traced message's body is kept up to this size (debug level or a
    # mode that lists content); the trace index keeps events this long and at most this many.
    trace_body_max_bytes: int = 4 * KIB
    trace_retention_s: float = 7 * 86400.0
    trace_max_events: int = 50_000_000
    # The trace index is decoded and written by a process of its own (started at the first
    # traced event), off the gateway's event loop and GIL; false: a thread of the gateway.
    trace_index_process: bool = True
    # Per-project queue state (SPEC P1): sampled this often, rolled up per interval, kept this long.
    queue_state_sample_s: float = 5.0
    queue_state_interval_s: float = 60.0
    queue_state_retention_s: float = 7 * 86400.0
    # Where `mqgate analytics --out <reports_dir>/<project>` reports are shown from in the
    # console's project page; empty = <data_dir>/reports.
    reports_dir: str = ""
    # Alerts (SPEC G9, docs/CONSOLE.md "Alerts"): every gateway checks the rules this often; an
    # alert that fires or resolves is POSTed as JSON to the webhook (empty: no notifications),
    # each attempt within the timeout, at most this many attempts. With a secret, each POST
    # carries X-Mqgate-Signature: sha256=<HMAC-SHA256 of the body under the secret>.
    alert_check_interval_s: float = 10.0
    alert_webhook_url: str = ""
    alert_webhook_timeout_s: float = 5.0
    alert_webhook_attempts: int = 3
    alert_webhook_secret: str = ""
    # Push consumers (issue 31, docs/PUSH.md): an endpoint whose host is (or resolves to) a
    # private, loopback or link-local address is refused unless this is set, so the push
    # feature is no way into the gateway's own network. Each gateway runs at most
    # push_max_consumers push consumers' deliveries.
    push_allow_private_endpoints: bool = False
    push_max_consumers: int = 1000
    # Streams (`GET /mq/stream`, SSE or WebSocket; docs/STREAM.md) open on one gateway at once,
    # in all and per consumer (0: no limit); one more is refused 429 with Retry-After.
    stream_max_open: int = 1000
    stream_max_per_consumer: int = 100
    # A consumer alerts when at least this many of its messages were dead-lettered within the
    # window (0: no dead-letter alerts).
    alert_dead_letters: int = 1
    alert_dead_letter_window_s: float = 300.0
    # Failover between store clusters (SPEC P8, docs/FAILOVER.md). Clusters to add at start-up
    # ("[pool/]name=url ..."; more through POST /admin/clusters). A cluster fails after
    # failover_fail_after hard failures in a row (connect failure, no answer within
    # failover_send_timeout_s) or when at least failover_error_rate of the last
    # failover_error_window_s's outcomes (at least failover_min_samples) were errors; it serves
    # again after failover_rejoin_probes good probes spanning failover_rejoin_min_s. Probes run
    # every failover_probe_interval_s; every gateway reads the switch record every
    # failover_check_s (two gateways disagree for at most 2 x that). An automatic fail-back
    # waits failover_failback_dwell_s after a switch. Produces no cluster can take wait in the
    # spool (<data_dir>/spool), at most spool_max_bytes; past that: 503.
    failover_clusters: str = ""
    failover_send_timeout_s: float = 60.0
    failover_fail_after: int = 2
    failover_error_window_s: float = 30.0
    failover_error_rate: float = 0.5
    failover_min_samples: int = 20
    failover_rejoin_probes: int = 5
    failover_rejoin_min_s: float = 0.0
    failover_probe_interval_s: float = 1.0
    failover_probe_timeout_s: float = 2.0
    failover_check_s: float = 1.0
    failover_failback_dwell_s: float = 60.0
    spool_max_bytes: int = 256 * MIB
    # The store process's socket, for a worker of `mqgate serve --workers N` on the embedded
    # store (set by the serve command, from MQGATE_STORE_PROCESS); empty: the backends in process.
    store_process: str = field(default="", metadata={"internal": True})
    # Where each setting that is not its default came from ("file <path>", "env MQGATE_…",
    # "command line"): filled by load_settings, shown to admins (the console's settings page).
    sources: dict[str, str] = field(
        default_factory=dict, repr=False, compare=False, metadata={"internal": True}
    )

    @property
    def fsync_interval_ms(self) -> int | None:
        """None for fsync=always, else the interval in ms."""
        return parse_fsync(self.fsync)

    @property
    def uses_redis(self) -> bool:
        return self.store.startswith(REDIS_SCHEMES)

    def detection_rules(self) -> DetectionRules:
        """The failover detector's thresholds (BadRequest naming a setting out of range)."""
        try:
            return DetectionRules(
                send_timeout_s=self.failover_send_timeout_s,
                fail_after=self.failover_fail_after,
                window_s=self.failover_error_window_s,
                error_rate=self.failover_error_rate,
                min_samples=self.failover_min_samples,
                rejoin_probes=self.failover_rejoin_probes,
                rejoin_min_s=self.failover_rejoin_min_s,
            )
        except ValueError as exc:
            raise BadRequest(f"failover settings: {exc}", field="failover_send_timeout_s") from exc

    def resolved_registry_url(self) -> str:
        return self.registry or f"sqlite:///{Path(self.data_dir).resolve() / 'registry.db'}"

    def project_report_dir(self, project: str) -> Path:
        """Where the console looks for a project's trace analytics report (issue 14)."""
        return Path(self.reports_dir or Path(self.data_dir) / "reports") / project

    def index_url(self, name: str) -> str:
        """Where a derived index lives (trace index, queue-state history): the registry's
        PostgreSQL when there is one (shared by every gateway), else its own SQLite file
        beside the data, so its writes never wait on the registry's."""
        if self.registry and not self.registry.startswith("sqlite"):
            return self.registry
        return f"sqlite:///{Path(self.data_dir).resolve() / name}"


def setting_fields() -> list[dataclasses.Field[Any]]:
    """The settings an operator sets (a file, MQGATE_* variables, flags)."""
    return [f for f in fields(Settings) if not f.metadata.get("internal")]


def parse_fsync(value: str) -> int | None:
    if value == "always":
        return None
    if value.startswith("interval:"):
        try:
            ms = int(value.split(":", 1)[1])
        except ValueError:
            ms = -1
        if ms > 0:
            return ms
    raise BadRequest(f"fsync must be 'always' or 'interval:<ms>', not {value!r}", field="fsync")


def _coerce(name: str, raw: Any, target: Any) -> Any:
    kind = type(target)
    if isinstance(target, Path):
        return Path(raw)
    if kind is bool:
        return str(raw).lower() in ("1", "true", "yes", "on")
    try:
        return kind(raw)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"setting {name} must be a {kind.__name__}", field=name) from exc


def load_settings(
    config_file: Path | None = None,
    env: dict[str, str] | None = None,
    **overrides: Any,
) -> Settings:
    settings = Settings()
    env = dict(os.environ) if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if config_file is None and env.get(f"{ENV_PREFIX}CONFIG"):
        config_file = Path(env[f"{ENV_PREFIX}CONFIG"])
    if config_file is not None:
        with open(config_file, "rb") as fh:
            values.update(tomllib.load(fh))
        sources.update(dict.fromkeys(values, f"file {config_file}"))
    for f in setting_fields():
        key = ENV_PREFIX + f.name.upper()
        if key in env:
            values[f.name] = env[key]
            sources[f.name] = f"env {key}"
    given = {k: v for k, v in overrides.items() if v is not None}
    values.update(given)
    sources.update(dict.fromkeys(given, "command line"))
    known = {f.name for f in setting_fields()}
    unknown = set(values) - known
    if unknown:
        raise BadRequest(f"unknown settings: {', '.join(sorted(unknown))}", field=sorted(unknown)[0])
    for name, raw in values.items():
        values[name] = _coerce(name, raw, getattr(settings, name))
    settings = dataclasses.replace(settings, **values, sources=sources)
    parse_fsync(settings.fsync)
    validate_name(settings.broker_name, "broker_name")
    validate_name(settings.redis_prefix, "redis_prefix")
    if settings.store != "embedded" and not settings.uses_redis:
        raise BadRequest(f"store must be 'embedded' or a redis:// URL, not {settings.store!r}", field="store")
    if settings.redis_wait_replicas < 0 or settings.redis_wait_timeout_ms < 1:
        raise BadRequest(
            "redis_wait_replicas must be 0 or more and redis_wait_timeout_ms 1 or more",
            field="redis_wait_replicas",
        )
    settings.detection_rules()
    for name in (
        "failover_probe_interval_s",
        "failover_probe_timeout_s",
        "failover_check_s",
        "spool_max_bytes",
        "console_signin_failures_per_user",
        "console_signin_failures_per_ip",
        "console_signin_window_s",
    ):
        if getattr(settings, name) <= 0:
            raise BadRequest(f"{name} must be positive", field=name)
    for name in (
        "max_concurrent_admin_requests",
        "max_concurrent_read_requests",
        "console_max_concurrent_requests",
        "stream_max_open",
        "stream_max_per_consumer",
    ):
        if getattr(settings, name) < 0:
            raise BadRequest(f"{name} must be 0 (no limit) or more", field=name)
    if settings.disk_free_floor_bytes < 0:
        raise BadRequest("disk_free_floor_bytes must be 0 (off) or more", field="disk_free_floor_bytes")
    if not 1 <= settings.workers <= MAX_WORKERS:
        raise BadRequest(f"workers must be between 1 and {MAX_WORKERS}", field="workers")
    return settings
