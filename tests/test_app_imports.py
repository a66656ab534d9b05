"""What a gateway imports to start (issue 28: start → /healthz within 0.5 s): not the doors
most gateways never open, nor a database dialect it does not use. Each check in a fresh
interpreter, whose modules are what importing the app loads."""

from __future__ import annotations

import subprocess
import sys


def modules_after_importing(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return set(out.stdout.split())


def test_the_app_loads_the_compatibility_edges_and_postgresql_only_when_used() -> None:
    loaded = modules_after_importing("mqgate.app")
    assert "mqgate.app" in loaded and "mqgate.sqs.detect" in loaded and "mqgate.aliyun.detect" in loaded
    edges = sorted(m for m in loaded if m.startswith(("mqgate.sqs.", "mqgate.aliyun.")))
    assert edges == ["mqgate.aliyun.detect", "mqgate.sqs.detect"], edges
    assert "sqlalchemy.dialects.postgresql" not in loaded
    assert "jinja2" not in loaded  # the console's templates: made for its first page


def test_the_serve_commands_preparation_does_not_load_the_app() -> None:
    """`mqgate serve --workers N` prepares the data directory and the registry in its own
    process and leaves the app to the workers: importing it there too delayed the workers' start
    by the app's import (about 0.2 s)."""
    loaded = modules_after_importing("mqgate.preparation")
    assert "mqgate.registry.sql" in loaded
    assert not {"mqgate.app", "mqgate.api.routes_data", "mqgate.console.app"} & loaded


def test_the_apps_records_are_structs_made_at_import_not_dataclasses() -> None:
    """Python 3.11 makes a dataclass by compiling each of its methods apart: 0.3 ms a class, about
    0.7 ms one frozen with slots; a msgspec Struct takes about 12 µs. The 136 dataclasses a
    start made were a fifth of the import (about 100 ms). The two left: `Settings` (fields read
    by `dataclasses.fields`, with metadata) and the message window (a field left out of repr)."""
    code = (
        "import sys, dataclasses, mqgate.app\n"
        "for m in list(sys.modules.values()):\n"
        "    if m is not None and m.__name__.startswith('mqgate'):\n"
        "        for v in vars(m).values():\n"
        "            if isinstance(v, type) and v.__module__ == m.__name__ and dataclasses.is_dataclass(v):\n"
        "                print(f'{m.__name__}.{v.__qualname__}')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert set(out.stdout.split()) == {"mqgate.settings.Settings", "mqgate.core.message_window.Window"}
