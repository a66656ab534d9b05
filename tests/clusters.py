"""Redis Cluster and Sentinel deployments of the test's own, on free 127.0.0.1 ports.

Every server is a `redis-server` child process in a temporary directory, stopped by its PID
(SIGTERM, then SIGKILL). Nothing here uses the machine's Redis on 6379.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import IN_CI, kill9, terminate, wait_until

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

    def stop(self) -> None:
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
        for n in self.nodes:
            if n.alive and "master" in n.info("replication").get("role", ""):
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
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + "/" + self.service

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
