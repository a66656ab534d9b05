"""A gateway with the console (tests/console/serve.py) in its own process, users made with
`mqgate user`, signed-in HTTP clients, and a headless Chromium (Debian's) through Playwright."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, free_port, terminate, wait_until

PASSWORD = "correct horse battery"
ADMIN_TOKEN = "mqa_console_test_token"
ARTIFACTS = ROOT / "tests" / "console" / "artifacts"
DOCS_IMAGES = ROOT / "docs" / "images"


def user_cli(data_dir: Path, *args: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqgate.cli.user", *args, "--data-dir", str(data_dir)],
        input=(password + "\n") if password is not None else None,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"},
    )


@dataclass
class ConsoleServer:
    data_dir: Path
    per_user: int = 3
    per_ip: int = 1000
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)  # settings (MQGATE_...) of this server

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add_user(self, name: str, role: str, project: str = "*") -> None:
        out = user_cli(self.data_dir, "add", name, "--role", role, "--project", project, "--password-stdin",
                       password=PASSWORD)  # fmt: skip
        assert out.returncode == 0, out.stderr

    def start(self) -> ConsoleServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir.parent / f"console-{self.port}.log", "ab")  # noqa: SIM115
        env = {
            **os.environ,
            "MQGATE_ADMIN_TOKEN": ADMIN_TOKEN,
            "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
            **self.env,
        }
        args = [str(self.port), str(self.data_dir), str(self.per_user), str(self.per_ip)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.console.serve", *args],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"console server exited: {self.log_tail()}")
            try:
                return httpx.get(self.url + "/console/signin", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 30, "the console to answer")
        return self

    def log_tail(self) -> str:
        path = self.data_dir.parent / f"console-{self.port}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        terminate(self.proc, grace_s=10)

    def admin(self, method: str, path: str, **body: Any) -> Any:
        r = httpx.request(method, self.url + path, json=body if method != "GET" else None,
                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)  # fmt: skip
        assert r.status_code == 200, r.text
        return r.json()["result"]


OPEN_CLIENTS: list[httpx.Client] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while OPEN_CLIENTS:
        OPEN_CLIENTS.pop().close()


def sign_in(server: ConsoleServer, name: str, password: str = PASSWORD) -> httpx.Client:
    """An HTTP client with a console session (the form's double-submit token included); closed
    after the test."""
    client = httpx.Client(base_url=server.url, timeout=30)
    OPEN_CLIENTS.append(client)
    client.get("/console/signin")
    token = client.cookies["mqgate_console_signin"]
    r = client.post("/console/signin", data={"name": name, "password": password, "signin_token": token})
    assert r.status_code == 303, r.text
    return client


def csrf_of(client: httpx.Client, page: str = "/console/") -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', client.get(page).text)
    assert found is not None
    return found.group(1)


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleServer]:
    srv = ConsoleServer(tmp_path_factory.mktemp("console") / "data")
    srv.data_dir.mkdir(parents=True)
    srv.add_user("admin", "admin")
    srv.start()
    yield srv
    srv.stop()


def open_page(
    browser: Any, server: ConsoleServer, width: int = 1280, timeout_ms: float | None = None, **options: Any
) -> Iterator[Any]:
    """A page in a fresh browser context on `server` (nothing cached), confirmations accepted."""
    context = browser.new_context(base_url=server.url, viewport={"width": width, "height": 900}, **options)
    page = context.new_page()
    if timeout_ms is not None:
        page.set_default_timeout(timeout_ms)
    page.on("dialog", lambda d: d.accept())
    yield page
    context.close()


@pytest.fixture
def page(browser: Any, console: ConsoleServer) -> Iterator[Any]:
    yield from open_page(browser, console)


def shot(page: Any, name: str) -> None:
    """A screenshot of the page as a test artifact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def docs_shots(page: Any, name: str) -> None:
    """The page as docs/CONSOLE.md shows it at both widths (`<name>-1366`, `<name>-390`), then
    back at the width it had."""
    size = page.viewport_size
    for width in (1366, 390):
        page.set_viewport_size({"width": width, "height": 900})
        docs_shot(page, f"{name}-{width}")
    page.set_viewport_size(size)


def docs_shot(page: Any, name: str) -> None:
    """A screenshot docs/CONSOLE.md shows: an artifact, copied to docs/images only when the run
    is asked to refresh them (`make screenshots`), so a test run leaves the tree as it was."""
    shot(page, name)
    if os.environ.get("MQGATE_DOCS_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ARTIFACTS / f"{name}.png", DOCS_IMAGES / f"{name}.png")
