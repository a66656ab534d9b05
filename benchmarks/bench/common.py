"""What every benchmark shares: paths, the log, the failure type, ports, percentiles."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
ROOT = BENCH_DIR.parent
# The project's venv (`make install`); the harness itself may run under another Python.
VENV_BIN = (
    ROOT / ".venv" / "bin" if (ROOT / ".venv" / "bin" / "python").exists() else Path(sys.executable).parent
)
VENV_PY = VENV_BIN / "python"
MQGATE = VENV_BIN / "mqgate"
LUA_DIR = BENCH_DIR / "lua"
HOST = "127.0.0.1"
MSG_BYTES = 100


class BenchFailure(Exception):
    """A benchmark that could not give its figure: reported as FAILED with the reason."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def tail(path: Path | None, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path else ""
    except OSError:
        return ""


def fmt(x: float, unit: str = "") -> str:
    """A figure with as many digits as it deserves: 12,345 / 12.3 / 1.23."""
    s = f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.3g}"
    return s + unit


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "—"
