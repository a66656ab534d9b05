"""Where a run's results go: a dated section appended to benchmarks/HISTORY.md (the journal:
machine, command, commit, the run's tables) and its headline rows rewritten in the current
table of benchmarks/RESULTS.md (matched by id; `--no-record` skips both)."""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import BENCH_DIR, ROOT, VENV_PY, log

RESULTS = BENCH_DIR / "RESULTS.md"
HISTORY = BENCH_DIR / "HISTORY.md"
PACKAGES = ("uvicorn", "uvloop", "httptools", "granian", "msgspec", "redis", "hiredis")
COLUMNS = (
    "id",
    "figure",
    "value",
    "ceiling / baseline (same run)",
    "ratio",
    "notes",
    "date (UTC)",
    "machine",
    "commit",
    "command",
)


@dataclass
class Row:
    """One figure of a run: its value and what it is measured against, in the same run. Rows
    with an id are the current table's (RESULTS.md); `more` goes to HISTORY.md only."""

    id: str
    figure: str
    value: str
    baseline: str = "—"
    ratio: str = "—"
    notes: str = ""
    more: str = ""


def sh(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def git_commit(where: Path = ROOT) -> str:
    """The short commit of the checkout holding `where`, and whether its tree there is dirty."""
    head = sh(["git", "-C", str(where), "rev-parse", "--short", "HEAD"])
    if not re.fullmatch(r"[0-9a-f]+", head or ""):
        return "no commit"
    dirty = sh(["git", "-C", str(where), "status", "--porcelain", "--", "."])
    return head + (" (with uncommitted changes)" if dirty else "")


def machine(data_dir: Path | None = None, python: Path = VENV_PY) -> dict:
    """CPU, memory, kernel, file system of `data_dir`, versions as `python` sees them, code."""
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        "?",
    )
    found = re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())
    mem = f"{int(found.group(1)) / 1024 / 1024:.1f} GiB" if found else "?"
    script = (
        "import sys, importlib.metadata as m\n"
        "def v(p):\n"
        "    try:\n"
        "        return f'{p} {m.version(p)}'\n"
        "    except m.PackageNotFoundError:\n"
        "        return f'{p} not installed'\n"
        f"print(sys.version.split()[0], *[v(p) for p in {PACKAGES!r}], sep='; ')"
    )
    digest = hashlib.sha1()
    for p in sorted((ROOT / "src" / "mqgate").rglob("*.py")):
        digest.update(p.relative_to(ROOT).as_posix().encode())
        digest.update(p.read_bytes())
    where = data_dir if data_dir and data_dir.exists() else Path(tempfile.gettempdir())
    fs = sh(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", str(where)])
    wrk = sh(["sh", "-c", "wrk -v 2>&1 | head -1"]) if shutil.which("wrk") else "wrk not installed"
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "python": sh([str(python), "-c", script]),
        "fs": " ".join(fs.split()),
        "wrk": wrk,
        "git": git_commit(),
        "src_sha1": digest.hexdigest()[:12],
    }


def short_machine(m: dict) -> str:
    cpu = re.sub(r"\(R\)|\(TM\)| Processor| \d+-Core", "", m["cpu"]).strip()
    return f"{m['nproc']} CPUs ({cpu}), {m['memory']}, {m['fs'].split(' ')[0]}"


def command_line(argv: list[str]) -> str:
    import shlex

    return "python benchmarks/run.py " + shlex.join(argv)


def cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|") or "—"


def table(header: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> list[str]:
    """A Markdown table; columns in `right` aligned right."""
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|",
    ]
    return lines + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]


def record(
    args: argparse.Namespace,
    title: str,
    rows: list[Row],
    lines: list[str] | tuple[str, ...] = (),
    after: list[str] | tuple[str, ...] = (),
    m: dict | None = None,
    commit: str | None = None,
) -> None:
    """Print the run's section (header, `lines`, the rows' table, `after`); unless
    `--no-record`, append it to HISTORY.md and rewrite the rows with ids in RESULTS.md.
    `commit` names the code measured when it is not this checkout's."""
    m = m or machine()
    when = dt.datetime.now(dt.UTC)
    command = getattr(args, "cmdline", "python benchmarks/run.py")
    machine_text = (
        f"{m['nproc']} CPUs ({m['cpu']}), {m['memory']} RAM, kernel {m['kernel']}, data dir on {m['fs']}"
    )
    table_rows = [
        [
            f"`{r.id}`" if r.id else "",
            r.figure,
            r.value,
            r.baseline,
            r.ratio,
            "; ".join(filter(None, [r.notes, r.more])),
        ]
        for r in rows
    ]
    section = [
        f"## {when:%Y-%m-%d %H:%M:%S} UTC — {title}",
        "",
        f"- command: `{command}`",
        f"- machine: {machine_text}; every process on this machine, loopback",
        f"- software: Python {m['python']}; {m['wrk']}",
        f"- code: git {commit or m['git']}, src/mqgate sha1 {m['src_sha1']}",
        *lines,
        "",
        *(table(["id", "figure", "value", COLUMNS[3], "ratio", "notes"], table_rows, {2, 4}) if rows else []),
        *(["", *after] if after else []),
    ]
    text = "\n".join(section) + "\n"
    print("\n" + text)
    if not getattr(args, "no_record", False):
        with open(HISTORY, "a", encoding="utf-8") as out:
            out.write("\n" + text)
        current = [r for r in rows if r.id]
        code = commit or m["git"]
        update_current(
            current,
            when,
            short_machine(m),
            code.split(" ")[0] + ("*" if "uncommitted" in code else ""),
            command,
        )
        log(f"appended to {HISTORY.name}; {len(current)} row(s) of {RESULTS.name} rewritten")


def subcommand(sub: Any, common: Any, name: str, doc: str | None, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand whose --help is its module's docstring."""
    fmt = argparse.RawDescriptionHelpFormatter
    return sub.add_parser(name, parents=[common], description=doc, formatter_class=fmt, **kwargs)


def update_current(rows: list[Row], when: dt.datetime, machine_text: str, commit: str, command: str) -> None:
    """Replace the rows with these ids in RESULTS.md's table (new ids go at its end)."""
    lines = (
        RESULTS.read_text(encoding="utf-8").splitlines()
        if RESULTS.exists()
        else ["# mqgate benchmark results", ""]
    )
    try:
        start = next(i for i, ln in enumerate(lines) if ln.startswith("| id |"))
    except StopIteration:
        lines += table(list(COLUMNS), [])
        start = len(lines) - 2
    end = start + 2
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    for row in rows:
        text = (
            "| "
            + " | ".join(
                cell(c)
                for c in (
                    f"`{row.id}`",
                    row.figure,
                    row.value,
                    row.baseline,
                    row.ratio,
                    row.notes,
                    f"{when:%Y-%m-%d %H:%M}",
                    machine_text,
                    commit,
                    f"`{command}`",
                )
            )
            + " |"
        )
        found = next((i for i in range(start + 2, end) if lines[i].startswith(f"| `{row.id}` |")), None)
        if found is None:
            lines.insert(end, text)
            end += 1
        else:
            lines[found] = text
    RESULTS.write_text("\n".join(lines) + "\n", encoding="utf-8")
