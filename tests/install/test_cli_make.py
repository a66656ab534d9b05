"""The README's two commands: `make run` takes the port from make's command line or from
MQGATE_PORT, and `make test` passes pytest arguments and has a fast variant."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, free_port, wait_until

# Starts gateways or servers test by test: `make test` runs it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

# The venv the tests run in; `-o install…` below: it is installed already, make must not redo it.
VENV = str(Path(sys.executable).parent.parent)
# Under `make test PYTEST_ARGS=… TEST_WORKERS=…` the outer make's variables reach an inner make
# through these, and each variable set on its command line is in the environment too.
OUTER_MAKE = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "PYTEST_ARGS", "TEST_WORKERS")


def environment(**extra: str) -> dict[str, str]:
    """This environment without the outer make's variables and without MQGATE_* settings."""
    kept = {k: v for k, v in os.environ.items() if k not in OUTER_MAKE and not k.startswith("MQGATE_")}
    return {**kept, **extra}


def make(*args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["make", "--no-print-directory", *args, f"VENV={VENV}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: make, its shell and the gateway
    )


def serves(port: int, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        assert proc.stderr is not None
        raise AssertionError(f"make run exited with {proc.returncode}: {proc.stderr.read().decode()}")
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    assert proc.stderr is not None
    proc.stderr.close()


@pytest.mark.parametrize("how", ["make variables", "environment"])
def test_make_run_takes_the_port_and_data_dir_either_way(tmp_path: Path, how: str) -> None:
    port, data = free_port(), tmp_path / "data"
    if how == "make variables":
        proc = make("-o", "install-gateway", "run", f"PORT={port}", f"DATA_DIR={data}", env=environment())
    else:
        env = environment(MQGATE_PORT=str(port), MQGATE_DATA_DIR=str(data))
        proc = make("-o", "install-gateway", "run", env=env)
    try:
        wait_until(lambda: serves(port, proc), 30, f"make run to serve on port {port}")
        assert (data / "admin.token").exists()
    finally:
        stop(proc)


def dry_run(target: str, *args: str) -> list[str]:
    """The pytest command `make <target>` would run."""
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", "-o", "install", target, f"VENV={VENV}", *args],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    [line] = [line for line in out.stdout.splitlines() if line.startswith(f"{VENV}/bin/pytest")]
    return shlex.split(line)


COVERAGE = ["--cov", "--cov-report=term:skip-covered"]
XDIST = ["-n", "4", "--dist", "loadscope"]


def test_make_test_passes_pytest_arguments() -> None:
    whole = dry_run("test")[1:]  # the whole suite, as CI runs it: coverage with its floor
    [floor] = [arg for arg in whole if arg.startswith("--cov-fail-under=")]
    # a measured floor (a whole run's total less one), not a placeholder that holds nothing back
    # In four processes (two per core here), a module's tests in one of them (tests/conftest.py).
    assert whole == [*XDIST, *COVERAGE, floor] and int(floor.removeprefix("--cov-fail-under=")) >= 70
    # A part of the suite: coverage reported, no floor.
    assert dry_run("test", "PYTEST_ARGS=-k produce -x")[1:] == [*XDIST, *COVERAGE, "-k", "produce", "-x"]
    fast = dry_run("test-fast", "PYTEST_ARGS=-k produce -x")[1:]
    assert fast == [*XDIST, "-m", "not slow", "-k", "produce", "-x"]
    # As many processes as asked; 0: this one.
    assert dry_run("test-fast", "TEST_WORKERS=3")[1:] == ["-n", "3", "--dist", "loadscope", "-m", "not slow"]
    assert dry_run("test-fast", "TEST_WORKERS=0")[1:] == ["-m", "not slow"]


def collected_files(*args: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return {line.split("::")[0] for line in out.splitlines() if "::" in line}


def test_make_test_fast_leaves_out_the_slow_tests_only() -> None:
    command = dry_run("test-fast", "TEST_WORKERS=0")
    assert command[1:] == ["-m", "not slow"]
    fast, slow = collected_files(*command[1:]), collected_files("-m", "slow")
    for path in (
        "tests/services/test_crash.py",
        "tests/offsets/test_redis_load.py",
        "tests/spark/test_source.py",
        "tests/api/test_schemathesis.py",
        "tests/console/test_browser.py",
        "tests/install/test_cli_make.py",  # a module that starts processes test by test
    ):
        assert path in slow, path
        assert path not in fast, path
    assert "tests/api/test_http_api.py" in fast and "tests/install/test_light_imports.py" in fast
