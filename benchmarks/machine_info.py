"""What a results section says about the machine and the code: shared by the benchmark scripts."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("uvicorn", "uvloop", "httptools", "granian", "msgspec", "redis", "hiredis")


def sh(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def machine(data_dir: Path, python: Path) -> dict:
    """CPU, memory, kernel, file system of `data_dir`, versions as `python` sees them, code."""
    cpu = "?"
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                cpu = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, AttributeError):
        pass
    vers = sh(
        [
            str(python),
            "-c",
            "import sys, importlib.metadata as m\n"
            "def v(p):\n"
            "    try:\n"
            "        return f'{p} {m.version(p)}'\n"
            "    except m.PackageNotFoundError:\n"
            "        return f'{p} not installed'\n"
            f"print(sys.version.split()[0], *[v(p) for p in {PACKAGES!r}], sep='; ')",
        ]
    )
    digest = hashlib.sha1()
    for p in sorted((ROOT / "src" / "mqgate").rglob("*.py")):
        digest.update(p.relative_to(ROOT).as_posix().encode())
        digest.update(p.read_bytes())
    head = sh(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]) or "none"
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "python": vers,
        "fs": sh(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", str(data_dir)]),
        "git": head if re.fullmatch(r"[0-9a-f]+", head or "") else "no commit",
        "src_sha1": digest.hexdigest()[:12],
    }
