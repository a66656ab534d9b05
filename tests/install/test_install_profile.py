"""The install profiles hold: the gateway and the CLI load no optional dependency, the plain
install depends on the gateway's packages only, and the locks pin what pyproject.toml asks for."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT

PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
DEV_LOCK = ROOT / "requirements" / "dev.lock"
GATEWAY_LOCK = ROOT / "requirements" / "gateway.lock"

# What `pip install mqgate` may bring: the gateway on the embedded store. A new core dependency
# is a decision about every gateway's install: add it here on purpose, or make it an extra.
# websockets: uvicorn's WebSocket protocol for streams (docs/STREAM.md).
GATEWAY_PACKAGES = {
    "msgspec", "uvicorn", "uvloop", "httptools", "websockets", "sqlalchemy", "prometheus-client", "jinja2"
}  # fmt: skip
OPTIONAL_PACKAGES = ("pyspark", "pyarrow", "pandas", "numpy", "redis", "psycopg")
PROFILES = {"redis": {"redis"}, "postgres": {"psycopg"}, "spark": {"pyspark", "pyarrow", "pandas"}}

# Loads the gateway's ASGI app module (and the worker processes' entry points: the HTTP workers'
# and the trace index writer's) and the CLI, then
# prints the optional packages that came with them.
IMPORT_PROBE = """
import importlib, sys
importlib.import_module("mqgate.app")
importlib.import_module("mqgate.app")
importlib.import_module("mqgate.tracing.index_worker")
importlib.import_module("mqgate.cli")
print(" ".join(sorted({m.partition(".")[0] for m in sys.modules} & set(sys.argv[1:]))))
"""


def requirement_names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(line).name) for line in requirements}


def locked_versions(lock: str) -> dict[str, set[str]]:
    """Name -> pinned versions (more than one where the lock forks on the Python version)."""
    pins: dict[str, set[str]] = {}
    for match in re.finditer(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)", lock, re.M):
        pins.setdefault(canonicalize_name(match.group(1)), set()).add(match.group(2))
    return pins


def test_importing_the_gateway_and_the_cli_loads_no_optional_package() -> None:
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, *OPTIONAL_PACKAGES],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [], f"importing the gateway loads {out.stdout.strip()}"


def test_the_plain_install_is_the_gateway_alone() -> None:
    core = PYPROJECT["project"]["dependencies"]
    assert requirement_names(core) <= GATEWAY_PACKAGES, core
    # uvicorn[standard] would bring watchfiles, dotenv and YAML, which the gateway never uses.
    assert all(not Requirement(line).extras for line in core), core


def test_each_profile_is_an_extra_and_dev_has_them_all() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    for profile, packages in PROFILES.items():
        assert packages <= requirement_names(extras[profile]), (profile, extras[profile])
    # The suite covers every backend and the Spark side, so `make test` installs every profile.
    assert set(PROFILES) <= _expand(extras, "dev"), extras["dev"]


def _expand(extras: dict[str, list[str]], profile: str) -> set[str]:
    """The extras a profile includes through `mqgate[...]`, transitively."""
    found: set[str] = set()
    for line in extras[profile]:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == "mqgate":
            for extra in requirement.extras - found:
                found |= {extra} | _expand(extras, extra)
    return found


def test_the_locks_pin_every_requirement_within_its_range() -> None:
    dev_pins = locked_versions(DEV_LOCK.read_text())
    extras = PYPROJECT["project"]["optional-dependencies"]
    wanted = [*PYPROJECT["project"]["dependencies"], *(line for lines in extras.values() for line in lines)]
    wanted += PYPROJECT["build-system"]["requires"]
    for line in wanted:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        if name == "mqgate":
            continue
        assert name in dev_pins, f"{line} is not in {DEV_LOCK.name}: run `make lock`"
        for version in dev_pins[name]:
            pinned = f"{name}=={version}"
            assert requirement.specifier.contains(version), f"{DEV_LOCK.name} pins {pinned}, not {line}"
    for tool in ("pip", "ruff", "mypy", "pytest"):
        assert tool in dev_pins, f"{DEV_LOCK.name} does not pin {tool}"


def test_the_gateway_lock_is_the_gateway_with_its_drivers_at_the_dev_versions() -> None:
    """`make run` installs the gateway with the Redis and PostgreSQL drivers, so every documented
    command works on it (`--store redis://`, `--registry postgresql+psycopg://`, `mqgate cluster
    add`); Spark stays out (`mqgate analytics` says which extra it needs)."""
    dev_pins = locked_versions(DEV_LOCK.read_text())
    gateway_pins = locked_versions(GATEWAY_LOCK.read_text())
    drivers = PROFILES["redis"] | PROFILES["postgres"]
    assert set(gateway_pins) >= GATEWAY_PACKAGES | drivers, sorted(gateway_pins)
    assert not set(PROFILES["spark"]) & set(gateway_pins), sorted(gateway_pins)
    for name, versions in gateway_pins.items():
        assert versions == dev_pins.get(name), (name, versions, dev_pins.get(name))
