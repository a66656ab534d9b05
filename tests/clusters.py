"""Redis Cluster and Sentinel deployments of the test's own, on free 127.0.0.1 ports.

Every server is a `redis-server` child process in a temporary directory, stopped by its PID
(SIGTERM, then SIGKILL). Nothing here uses the machine's Redis on 6379.
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI, Server, kill9, terminate, wait_until

CLUSTER_NODE_TIMEOUT_MS = 1000
SENTINEL_DOWN_AFTER_MS = 1000


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed (required in CI)")
        pytest.skip(f"SKIPPED LOUDLY: {name} is not installed")
    return found


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port(taken: set[int]) -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(1000):
        port = random.randrange(20000, 30000)
        if port not in taken and port + 10000 not in taken and _bindable(port) and _bindable(port + 10000):
            taken.add(port)
            return port
    raise AssertionError("no free port pair for a cluster node")


def command(port: int, *args: str, timeout_s: float = 5.0) -> str:
    """One redis-cli command against 127.0.0.1:port; its output ('' if it cannot connect)."""
    try:
        done = subprocess.run(
            [_binary("redis-cli"), "-h", "127.0.0.1", "-p", str(port), *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return ""
    return done.stdout.strip()


@dataclass(eq=False)
class Node:
    directory: Path
    port: int
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Node:
        self.directory.mkdir(parents=True, exist_ok=True)
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [_binary("redis-server"), *self.args], cwd=self.directory, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        wait_until(self.answers, 10, f"redis on {self.port} to answer PING", interval_s=0.05)
        return self

    def answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"redis-server {self.port} exited: {self.log_tail()}")
        return command(self.port, "PING", timeout_s=1) == "PONG"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self) -> str:
        path = self.directory / "redis.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def kill9(self) -> None:
        kill9(self.proc)

    def pause(self) -> None:
        """SIGSTOP: a replica falling behind (a slow disk or network), on purpose."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused server cannot stop
        terminate(self.proc, grace_s=5)

    def info(self, section: str) -> dict[str, str]:
        out = {}
        for line in command(self.port, "INFO", section).splitlines():
            key, sep, value = line.partition(":")
            if sep:
                out[key] = value.strip()
        return out


def _persistence_off() -> list[str]:
    # Failover tests are about replication: a killed node never comes back with its files.
    return ["--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"]


@dataclass
class RedisClusterProcs:
    """3 masters + 3 replicas (by default), made with `redis-cli --cluster create`."""

    root: Path
    masters: int = 3
    replicas: int = 1
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:3])

    def start(self) -> RedisClusterProcs:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> RedisClusterProcs:
        taken: set[int] = set()
        for i in range(self.masters * (1 + self.replicas)):
            port = cluster_port(taken)
            args = [
                "--port", str(port), "--bind", "127.0.0.1", "--dir", ".",
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS),
                # A replica takes over however long it was cut off (tests kill masters).
                "--cluster-replica-validity-factor", "0",
                *_persistence_off(),
            ]  # fmt: skip
            self.nodes.append(Node(self.root / f"node{i}", port, args).start())
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        created = subprocess.run(
            [_binary("redis-cli"), "--cluster", "create", *addresses,
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert created.returncode == 0, created.stdout + created.stderr
        wait_until(self.healthy, 30, "the cluster to be ok on every node", interval_s=0.1)
        return self

    def healthy(self) -> bool:
        """Every live node says cluster_state:ok and sees each slot served by a live master."""
        live = [n for n in self.nodes if n.alive]
        if not all("cluster_state:ok" in command(n.port, "CLUSTER", "INFO") for n in live):
            return False
        masters = {self.master_of_slot(s, live[0].port) for s in (0, 8000, 16383)}
        if not all(m is not None and m.alive for m in masters):
            return False
        # Replicas in sync, so a WAIT right away can count them.
        return all(
            info.get("master_link_status") == "up"
            for info in (n.info("replication") for n in live)
            if info.get("role") == "slave"
        )

    def roles(self) -> dict[int, str]:
        return {n.port: n.info("replication").get("role", "?") for n in self.nodes if n.alive}

    def master_of_slot(self, slot: int, ask_port: int | None = None) -> Node | None:
        port = ask_port or next(n.port for n in self.nodes if n.alive)
        for line in command(port, "CLUSTER", "NODES").splitlines():
            parts = line.split()
            if "master" not in parts[2] or "fail" in parts[2]:
                continue
            for r in parts[8:]:
                lo, _, hi = r.partition("-")
                if not lo.startswith("[") and int(lo) <= slot <= int(hi or lo):
                    p = int(parts[1].split("@")[0].rsplit(":", 1)[1])
                    return next(n for n in self.nodes if n.port == p)
        return None

    def node_id(self, node: Node) -> str:
        return command(node.port, "CLUSTER", "MYID")

    def keyslot(self, key: str) -> int:
        return int(command(self.nodes[0].port, "CLUSTER", "KEYSLOT", key))

    def move_slot(self, slot: int, target: Node, batch: int = 10) -> int:
        """Move one slot to `target` the way `redis-cli --cluster reshard` does (IMPORTING /
        MIGRATING, MIGRATE in batches, SETSLOT NODE everywhere); the number of keys moved."""
        source = self.master_of_slot(slot)
        assert source is not None and source is not target
        src_id, dst_id = self.node_id(source), self.node_id(target)
        assert command(target.port, "CLUSTER", "SETSLOT", str(slot), "IMPORTING", src_id) == "OK"
        assert command(source.port, "CLUSTER", "SETSLOT", str(slot), "MIGRATING", dst_id) == "OK"
        moved = 0
        while True:
            keys = command(source.port, "CLUSTER", "GETKEYSINSLOT", str(slot), str(batch)).split()
            if not keys:
                break
            out = command(
                source.port, "MIGRATE", "127.0.0.1", str(target.port), "", "0", "5000", "KEYS", *keys
            )
            assert out in ("OK", "NOKEY"), out
            moved += len(keys)
        # Target first, then source (the order redis-cli uses): the other way round, a client
        # bounces between them (MOVED from each) until the target knows it owns the slot.
        others = [n for n in self.nodes if n.alive and n not in (source, target)]
        for n in [target, source, *others]:
            command(n.port, "CLUSTER", "SETSLOT", str(slot), "NODE", dst_id)
        return moved

    def replica_of(self, master: Node) -> Node:
        master_id = self.node_id(master)
        for line in command(master.port, "CLUSTER", "NODES").splitlines():
            parts = line.split()
            if parts[3] == master_id:
                p = int(parts[1].split("@")[0].rsplit(":", 1)[1])
                return next(n for n in self.nodes if n.port == p)
        raise AssertionError(f"no replica of {master.port}")

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


@dataclass
class SentinelProcs:
    """A primary, one replica and three Sentinels watching them as service `SERVICE`."""

    root: Path
    service: str = "mqsvc"
    primary: Node | None = None
    replica: Node | None = None
    sentinels: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        return (
            "redis+sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + "/" + self.service
        )

    def start(self) -> SentinelProcs:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> SentinelProcs:
        taken: set[int] = set()
        p, r = cluster_port(taken), cluster_port(taken)
        base = ["--bind", "127.0.0.1", "--dir", ".", *_persistence_off()]
        self.primary = Node(self.root / "primary", p, ["--port", str(p), *base]).start()
        self.replica = Node(
            self.root / "replica", r, ["--port", str(r), *base, "--replicaof", "127.0.0.1", str(p)]
        ).start()
        wait_until(lambda: self.primary_info().get("connected_slaves") == "1", 15, "the replica to attach")
        for i in range(3):
            port = cluster_port(taken)
            folder = self.root / f"sentinel{i}"
            folder.mkdir(parents=True)
            (folder / "sentinel.conf").write_text(
                f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {p} 2\n"
                f"sentinel down-after-milliseconds {self.service} {SENTINEL_DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {self.service} 10000\n"
            )
            self.sentinels.append(Node(folder, port, ["sentinel.conf", "--sentinel"]).start())
        wait_until(lambda: self.sentinels_agree(p), 20, "every Sentinel to know the primary and replica")
        return self

    def primary_info(self) -> dict[str, str]:
        assert self.primary is not None
        return self.primary.info("replication")

    def primary_port(self, sentinel: Node) -> int | None:
        out = command(sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service).split()
        return int(out[1]) if len(out) == 2 else None

    def sentinels_agree(self, port: int) -> bool:
        for s in self.sentinels:
            if self.primary_port(s) != port:
                return False
            if "num-other-sentinels" not in command(s.port, "SENTINEL", "MASTER", self.service):
                return False
            replicas = command(s.port, "SENTINEL", "REPLICAS", self.service)
            if "slave" not in replicas:
                return False
        others = command(self.sentinels[0].port, "SENTINEL", "MASTER", self.service).splitlines()
        return others[others.index("num-other-sentinels") + 1] == "2"

    def stop(self) -> None:
        for n in [*self.sentinels, self.replica, self.primary]:
            if n is not None:
                n.stop()


# --- load through a gateway while a server fails or a slot moves ------------------------------


@dataclass
class LoadReport:
    produced_ok: set[str] = field(default_factory=set)  # answered 200: acknowledged produces
    produce_failures: int = 0  # 5xx or connection errors (the client would retry them)
    acked: set[str] = field(default_factory=set)  # in a batch whose ack answered 200
    ack_failures: int = 0
    # In a batch whose ack failed (503): committed or not, nobody knows; a 503 after a
    # replica-wait timeout usually did commit, so the batch does not come back.
    ack_uncertain: set[str] = field(default_factory=set)
    pull_failures: int = 0
    delivered_again_after_ack: set[str] = field(default_factory=set)
    stored: set[str] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)  # the first few failure answers
    stored_records: int = 0  # more than len(stored): a body stored twice (a produce retried)

    @property
    def settled(self) -> set[str]:
        return self.acked | self.ack_uncertain

    @property
    def lost_produces(self) -> set[str]:
        return self.produced_ok - self.stored

    def summary(self) -> str:
        return (
            f"acknowledged produces {len(self.produced_ok)} (failed {self.produce_failures}), "
            f"lost {len(self.lost_produces)}; acked {len(self.acked)} (ack failures {self.ack_failures}), "
            f"delivered again after a 200 ack {len(self.delivered_again_after_ack)}, "
            f"stored twice {self.stored_records - len(self.stored)}; "
            f"first failures: {self.failures}"
        )


class Load:
    """Producer threads and one consumer thread on one topic through a gateway.

    Every message body is unique; failed calls are counted, not retried (a retry would hide
    which write was acknowledged). `finish` drains what is left and reads every stored body."""

    def __init__(self, server: Any, topic: str, tokens: tuple[str, str], producers: int = 2) -> None:
        import threading

        import httpx

        self.server, self.topic = server, topic
        self._ptoken, self._ctoken = tokens
        self.report = LoadReport()
        self.pad = 0  # bytes added to each body from now on (0: short bodies)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._httpx = httpx
        self._threads = [
            threading.Thread(target=self._produce, args=(i,), daemon=True) for i in range(producers)
        ]
        self._threads.append(threading.Thread(target=self._consume, daemon=True))

    def _headers(self, token: str = "") -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.server.admin_token}"}

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def _produce(self, index: int) -> None:
        with self._httpx.Client(
            base_url=self.server.url, timeout=10, headers=self._headers(self._ptoken)
        ) as http:
            n = 0
            while not self._stop.is_set():
                body = f"p{index}-{n}"
                n += 1
                message = body + ("|" + "." * self.pad if self.pad else "")
                try:
                    r = http.post("/mq/produce", json={"producer": f"{self.topic}-p", "message": message})
                    ok, answer = r.status_code == 200, r.text
                except self._httpx.HTTPError as exc:
                    ok, answer = False, repr(exc)
                with self._lock:
                    if ok:
                        self.report.produced_ok.add(body)
                    else:
                        self.report.produce_failures += 1
                        if len(self.report.failures) < 5:
                            self.report.failures.append(answer[:300])
                if not ok:
                    self._stop.wait(0.02)

    def _pull_and_ack(self, http: Any) -> int:
        """One pull and its ack; how many messages it brought (-1 on a failure)."""
        try:
            r = http.get(
                "/mq/message", params={"topic": self.topic, "consumer": f"{self.topic}-c", "max": 50}
            )
            if r.status_code != 200:
                with self._lock:
                    self.report.pull_failures += 1
                return -1
            result = r.json()["result"]
            if result["status"] != "FOUND":
                return 0
            bodies = [_key(m["message"]) for m in result["msgList"]]
            a = http.post("/mq/ack", json={"consumer": f"{self.topic}-c", "requestId": result["requestId"]})
        except self._httpx.HTTPError:
            return -1
        with self._lock:
            again = self.report.acked.intersection(bodies)
            self.report.delivered_again_after_ack.update(again)
            if a.status_code == 200:
                self.report.acked.update(bodies)
            else:
                self.report.ack_failures += 1
                self.report.ack_uncertain.update(bodies)
        return len(bodies)

    def _consume(self) -> None:
        with self._httpx.Client(
            base_url=self.server.url, timeout=10, headers=self._headers(self._ctoken)
        ) as http:
            while not self._stop.is_set():
                if self._pull_and_ack(http) <= 0:
                    self._stop.wait(0.02)

    def count(self) -> int:
        with self._lock:
            return len(self.report.produced_ok)

    def failures(self) -> int:
        with self._lock:
            return self.report.produce_failures

    def finish(self, drain_s: float = 30.0) -> LoadReport:
        """Stop the load, read every stored body, then pull and ack until each stored body was
        acked (a batch whose pull failed after its lease comes back after the lock timeout and
        a redelivery backoff, SPEC S5) or `drain_s` passed."""
        import time

        self._stop.set()
        for t in self._threads:
            t.join(15)
        with self._httpx.Client(base_url=self.server.url, timeout=10, headers=self._headers()) as http:
            bounds = http.get("/mq/bounds", params={"topic": self.topic}).json()["result"]["queues"]
            for b in bounds:
                offset = b["min"]
                while offset < b["max"]:
                    params = {"topic": self.topic, "queue": b["queue"], "offset": offset, "max": 10_000}
                    result = http.get("/mq/read", params=params).json()["result"]
                    self.report.stored.update(_key(m["message"]) for m in result["msgList"])
                    self.report.stored_records += len(result["msgList"])
                    offset = result["next"]
        with self._httpx.Client(
            base_url=self.server.url, timeout=10, headers=self._headers(self._ctoken)
        ) as http:
            deadline = time.monotonic() + drain_s
            while not self.report.settled >= self.report.stored and time.monotonic() < deadline:
                if self._pull_and_ack(http) <= 0:
                    time.sleep(0.1)
        return self.report


def primary_lost_under_load(
    load: Load, primary: Node, replica: Node, promoted: Any, more: int = 100
) -> float:
    """The failure whose loss replica-wait prevents: the replica falls behind (paused) while
    acknowledged writes go on, then the primary dies and the replica is promoted. Returns the
    seconds from the kill to the promotion (`promoted()` true)."""
    import time

    replica.pause()
    load.pad = 200_000  # fill the replica's socket buffers: later writes wait on the primary
    try:
        # Without a replica wait, writes go on (and are acknowledged); with it, they time out.
        n0, f0 = load.count(), load.failures()
        wait_until(lambda: load.count() >= n0 + more or load.failures() >= f0 + 3, 20, "writes meanwhile")
        primary.kill9()
    finally:
        replica.resume()
        load.pad = 0
    killed = time.monotonic()
    wait_until(promoted, 30, "the replica to be promoted", interval_s=0.05)
    return time.monotonic() - killed


def _key(message: str) -> str:
    return message.partition("|")[0]


def gateway_on(url: str, tmp_path: Path, wait_replicas: int) -> Iterator[Server]:
    """A gateway on a cluster or Sentinel URL; with `wait_replicas`, produces and acks wait for
    that many replicas (at most 500 ms)."""
    srv = Server(
        tmp_path / "gw" / "data",
        extra_args=["--store", url],
        env={"MQGATE_REDIS_WAIT_REPLICAS": str(wait_replicas), "MQGATE_REDIS_WAIT_TIMEOUT_MS": "500"},
    )
    srv.data_dir.parent.mkdir(parents=True)
    yield srv.start()
    srv.stop()
