"""Running a JavaScript SDK's scenario suite (tests/sqs/js, tests/aliyun/js) against a gateway:
Node 20 or later and the SDK from the suite's lock file, failing in CI without them and skipped
loudly elsewhere; each scenario reports one JSON line `{"scenario", "ok", "error"}`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI, ROOT, Server


def missing(message: str) -> None:
    """Fail in CI, skip loudly elsewhere."""
    if IN_CI:
        pytest.fail(message + " (required in CI)")
    pytest.skip("SKIPPED LOUDLY: " + message)


def node_with(sdk_package: Path, js_dir: Path) -> str:
    """The `node` to run a suite with: Node 20 or later, with the SDK (its package.json) installed."""
    found = shutil.which("node")
    if found is None:
        missing("node is not installed (Node 20 or later: apt-get install nodejs npm)")
    assert found is not None
    version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30, check=True)
    major = re.match(r"v(\d+)\.", version.stdout.strip())
    if major is None or int(major.group(1)) < 20:
        missing(f"{found} is {version.stdout.strip()}; the suite needs Node 20 or later")
    if not sdk_package.exists():
        missing(f"{sdk_package.parent} is missing: run `make js-deps` (npm ci in {js_dir.relative_to(ROOT)})")
    return found


def run_suite(
    command: list[str], js_dir: Path, sdk: str, scenarios: Iterable[str], srv: Server, timeout_s: float
) -> None:
    """Run the suite; every scenario must report ok, none may be missing, nothing else printed."""
    try:
        done = subprocess.run(
            command, cwd=js_dir, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"{Path(command[1]).name} not done within {timeout_s:g}s; it reported:\n{out}")
    reports: dict[str, dict[str, Any]] = {}
    stray: list[str] = []
    for line in done.stdout.splitlines():
        try:
            report = json.loads(line)
        except json.JSONDecodeError:
            stray.append(line)
            continue
        reports[report["scenario"]] = report
    context = (
        f"{sdk}, exit status {done.returncode}\n"
        f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}\ngateway log:\n{srv.log_tail()}"
    )
    failing = [
        f"{name}: {report.get('error')}" for name, report in reports.items() if report.get("ok") is not True
    ]
    assert not failing, "scenarios failed:\n  " + "\n  ".join(failing) + "\n" + context
    never = [name for name in scenarios if name not in reports]
    assert not never, f"scenarios that never reported: {never}\n{context}"
    assert done.returncode == 0, context
    assert not stray, f"lines that are not a scenario's report: {stray}\n{context}"
