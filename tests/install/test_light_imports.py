"""The client and the `mqgate` command stay light: a plain install has no Spark, Arrow, pandas,
NumPy, Redis or PostgreSQL driver, and `mqgate --help` or an admin command must not load them.
Each check runs in a fresh interpreter and looks at sys.modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import free_port

HEAVY = ("pyspark", "pyarrow", "pandas", "numpy", "redis", "psycopg", "httpx")


def run_python(code: str) -> tuple[list[str], str]:
    """Run `code` (which may set `rc`), then list the HEAVY modules it loaded; (those, stderr)."""
    probe = (
        "import json, sys\nrc = None\n"
        + code
        + f"\nprint(json.dumps([rc, sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))]))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rc, heavy = json.loads(out.stdout.strip().splitlines()[-1])
    return [str(rc), *heavy], out.stderr


def test_importing_the_client_and_the_cli_loads_nothing_heavy() -> None:
    loaded, _ = run_python("import mqgate.client, mqgate.cli")
    assert loaded == ["None"]


def test_help_loads_nothing_heavy() -> None:
    loaded, _ = run_python(
        "from mqgate.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as exc:\n    rc = exc.code"
    )
    assert loaded == ["0"]


def test_an_admin_command_to_an_unreachable_gateway_exits_2_and_loads_nothing_heavy() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    loaded, stderr = run_python(
        f"from mqgate.cli import main\nrc = main(['topic', 'list', '--url', {url!r}, '--admin-token', 't'])"
    )
    assert loaded == ["2"]
    assert f"cannot reach the gateway at {url}" in stderr


def test_the_pipeline_command_checks_its_config_before_loading_spark(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[job]\nname = "x"\ngateway = "http://127.0.0.1:1"\nadmin_token = "t"\npartitions = 0\n')
    loaded, stderr = run_python(f"from mqgate.cli import main\nrc = main(['pipeline', 'run', {str(path)!r}])")
    assert loaded == ["2"]
    assert "job.partitions must be between 1 and 1024" in stderr


def printed_by(code: str) -> list[str]:
    """The lines `code` prints in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_loading_the_gateway_hashes_no_password() -> None:
    """A scrypt hash costs about 0.1 s: the console's dummy hash (what an unknown name's sign-in
    is checked against) was made at import, and every start waited for it (issue 28)."""
    printed = printed_by(
        "import hashlib\ncalls = []\nscrypt = hashlib.scrypt\n"
        "hashlib.scrypt = lambda *a, **k: (calls.append(1), scrypt(*a, **k))[1]\n"
        "import mqgate.app, mqgate.console.app, mqgate.console.passwords as p\n"
        "print(len(calls))\np.dummy_hash()\nprint(len(calls))"
    )
    assert printed == ["0", "1"]


def test_serve_loads_no_admin_command_nor_their_client() -> None:
    """A gateway's start is `mqgate serve`: the admin commands and the client they share were
    0.05-0.08 s of it (issue 28)."""
    printed = printed_by(
        "import sys\nfrom mqgate.cli import main\n"
        "try:\n    main(['serve', '--help'])\nexcept SystemExit as exc:\n    print(exc.code)\n"
        "admin = ('mqgate.client', 'mqgate.cli.admin', 'mqgate.cli.topic')\n"
        "print(sorted(m for m in sys.modules if m in admin))"
    )
    assert "--data-dir" in "\n".join(printed)  # serve's own help
    assert printed[-2:] == ["0", "[]"]
