"""Processes a benchmark starts (stopped by PID with their descendants, at the end, on failure
and on Ctrl-C) and the CPU they and the machine use."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

from .common import ROOT, BenchFailure

TICKS = os.sysconf("SC_CLK_TCK")
_started: list[subprocess.Popen] = []


def descendants(pid: int) -> list[int]:
    """PIDs of all live descendants of `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def signal_tree(pid: int, sig: int) -> None:
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


def kill9(proc: subprocess.Popen) -> None:
    """kill -9 of the process and every process under it, by PID; waits for it."""
    signal_tree(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def kill_tree(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Signal the process and its descendants by PID; SIGKILL whatever outlives `timeout`."""
    if proc.poll() is not None:
        return
    kids = descendants(proc.pid)
    for pid in [proc.pid, *kids]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)
    for pid in [proc.pid, *kids]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def cleanup() -> None:
    for proc in _started:
        kill_tree(proc, signal.SIGTERM, timeout=5)


atexit.register(cleanup)


def stop_on_sigterm() -> None:
    """SIGTERM ends the run as Ctrl-C does: through the `finally`s and `cleanup`."""

    def raise_exit(signum: int, frame: object) -> None:
        raise SystemExit(f"interrupted by signal {signum}")

    signal.signal(signal.SIGTERM, raise_exit)


def start(cmd: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
    """A process of the benchmark's own (a new session, output to `log_path`), stopped at exit."""
    with open(log_path, "ab") as fh:
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )
    _started.append(proc)
    return proc


def run_output(cmd: list[str], timeout: float, env: dict | None = None) -> str:
    """Run to the end (killed after `timeout`); its stdout, or BenchFailure with its stderr."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    _started.append(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc, signal.SIGKILL)
        raise BenchFailure(f"{' '.join(cmd[:4])} did not finish in {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise BenchFailure(f"{' '.join(cmd)} failed (rc {proc.returncode}): {err[-1500:]} {out[-800:]}")
    return out


def run_json(cmd: list[str], timeout: float, env: dict | None = None) -> dict:
    """The JSON object a benchmark process prints as its last line."""
    return json.loads(run_output(cmd, timeout, env).strip().splitlines()[-1])


# --- CPU and memory --------------------------------------------------------------------------


def _stat_fields(path: str) -> list[str]:
    stat = Path(path).read_text()
    return stat[stat.rindex(")") + 2 :].split()


def tree_cpu_seconds(pid: int) -> float:
    """user+system CPU seconds so far of `pid` and its descendants, live ones and those already
    waited for (redis-server's AOF-rewrite forks come and go within a run)."""
    total = 0.0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError):
            total += sum(int(v) for v in _stat_fields(f"/proc/{p}/stat")[11:15]) / TICKS
    return total


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of `pid` and the processes under it, main thread and the others of
    each apart: where a request's CPU goes."""
    out: dict[str, float] = {}
    for p in [pid, *descendants(pid)]:
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                fields = _stat_fields(f"{task}/stat")
            except OSError:
                continue
            # Python threads keep the process's name: the main thread is the one whose id is
            # the process's (the event loop), the others are the fsync and worker threads.
            thread = "main thread" if task.name == str(p) else "other threads"
            key = f"{'gateway' if p == pid else 'child'} {thread}"
            out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / TICKS
    return out


def cpu_by_kind(root: int, kinds: dict[str, str]) -> dict[str, float]:
    """CPU seconds so far of `root`'s descendants whose command line holds each kind's word."""
    out = dict.fromkeys(kinds, 0.0)
    for pid in descendants(root):
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()[:300].decode(errors="replace")
            fields = _stat_fields(f"/proc/{pid}/stat")
            kind = next((k for k, word in kinds.items() if word in cmd), None)
            if kind:
                out[kind] += (int(fields[11]) + int(fields[12])) / TICKS
    return out


def rss_bytes(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def system_busy_seconds() -> tuple[float, float]:
    """(process CPU seconds: user+nice+system, kernel irq+softirq seconds) of the whole
    machine, from /proc/stat. Loopback networking shows up as softirq, charged to no process."""
    vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]]
    return (vals[0] + vals[1] + vals[2]) / TICKS, (vals[5] + vals[6]) / TICKS


def own_and_waited_cpu() -> float:
    """CPU seconds of this harness plus its children already waited for (wrk)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def cpu_busy(seconds: float = 1.0) -> float:
    """Percent of all CPUs busy over `seconds` (other load on the box skews every figure)."""

    def sample() -> tuple[int, int]:
        vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return sum(vals), vals[3] + vals[4]

    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return 100.0 * (1 - (i1 - i0) / max(1, t1 - t0))
