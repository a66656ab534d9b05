"""Sign-in and role checks over plain HTTP against a real gateway with the console."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.console.conftest import PASSWORD, ConsoleServer, csrf_of, sign_in


def attempt(server: ConsoleServer, name: str, password: str) -> httpx.Response:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.get("/console/signin")
        token = client.cookies["mqgate_console_signin"]
        return client.post(
            "/console/signin", data={"name": name, "password": password, "signin_token": token}
        )


def error_text(r: httpx.Response) -> str:
    found = re.search(r'id="signin-error">([^<]*)<', r.text)
    return found.group(1) if found else ""


@pytest.fixture(scope="module")
def users(console: ConsoleServer) -> ConsoleServer:
    console.add_user("vera", "viewer")
    console.add_user("otto", "owner", "default")
    console.add_user("mona", "member", "elsewhere")
    console.admin("POST", "/admin/topics", name="sec-topic", queues=1)
    return console


def test_the_session_cookie_is_httponly_lax_and_pages_need_it(users: ConsoleServer) -> None:
    with httpx.Client(base_url=users.url, timeout=30) as anon:
        r = anon.get("/console/topics")
        assert r.status_code == 303 and r.headers["location"].startswith("/console/signin?next=")
        anon.get("/console/signin")
        token = anon.cookies["mqgate_console_signin"]
        r = anon.post("/console/signin", data={"name": "vera", "password": PASSWORD, "signin_token": token})
    cookie = next(
        v for k, v in r.headers.multi_items() if k == "set-cookie" and v.startswith("mqgate_console=")
    )
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/console" in cookie
    assert "Secure" not in cookie  # plain HTTP here; over TLS it is added
    assert httpx.get(users.url + "/").headers["location"] == "/console/"


def test_sign_in_without_the_form_token_is_refused(users: ConsoleServer) -> None:
    r = httpx.post(users.url + "/console/signin", data={"name": "vera", "password": PASSWORD})
    assert r.status_code == 403


def test_unknown_user_and_wrong_password_get_the_same_answer(users: ConsoleServer) -> None:
    unknown, wrong = attempt(users, "nobody-at-all", "whatever-pass"), attempt(users, "otto", "not-his-pass")
    assert unknown.status_code == wrong.status_code == 401
    assert error_text(unknown) == error_text(wrong) == "Wrong user name or password."


def test_sign_in_is_rate_limited_per_user(users: ConsoleServer) -> None:
    users.add_user("rita", "viewer")
    for _ in range(3):  # the server allows 3 failures per user name
        assert attempt(users, "rita", "wrong-password").status_code == 401
    blocked = attempt(users, "rita", PASSWORD)  # even the right password waits now
    assert blocked.status_code == 429 and "Too many sign-in attempts" in error_text(blocked)
    assert int(blocked.headers["retry-after"]) > 0
    # An unknown name is limited alike: its answers do not tell it apart.
    for _ in range(3):
        attempt(users, "ghost-user", "wrong-password")
    assert attempt(users, "ghost-user", "wrong-password").status_code == 429
    assert attempt(users, "vera", PASSWORD).status_code == 303  # others are not held up


def test_sign_in_is_rate_limited_per_address(tmp_path: Path) -> None:
    srv = ConsoleServer(tmp_path / "data", per_user=100, per_ip=4)
    srv.data_dir.mkdir(parents=True)
    srv.add_user("ivan", "viewer")
    srv.start()
    try:
        for i in range(4):
            assert attempt(srv, f"guess-{i}", "wrong-password").status_code == 401
        assert attempt(srv, "ivan", PASSWORD).status_code == 429
    finally:
        srv.stop()


def test_a_state_change_without_the_csrf_token_is_refused(users: ConsoleServer) -> None:
    admin = sign_in(users, "admin")
    form = {"name": "csrf-topic", "project": "default", "queues": "1"}
    assert admin.post("/console/topics", data=form).status_code == 403
    assert admin.post("/console/topics", data={**form, "csrf": "forged"}).status_code == 403
    assert "csrf-topic" not in {t["name"] for t in users.admin("GET", "/admin/topics")["topics"]}
    # Another site's form is refused even with a token.
    r = admin.post(
        "/console/topics", data={**form, "csrf": csrf_of(admin)}, headers={"origin": "http://evil.example"}
    )
    assert r.status_code == 403
    assert admin.post("/console/topics", data={**form, "csrf": csrf_of(admin)}).status_code == 303
    assert "csrf-topic" in {t["name"] for t in users.admin("GET", "/admin/topics")["topics"]}


def test_a_viewer_can_read_but_not_change(users: ConsoleServer) -> None:
    viewer = sign_in(users, "vera")
    assert "sec-topic" in viewer.get("/console/topics").text
    assert 'id="create-topic"' not in viewer.get("/console/topics").text
    token = csrf_of(viewer)
    for path, form in [
        ("/console/topics", {"name": "viewer-topic", "project": "default"}),
        ("/console/topics/sec-topic/delete", {}),
        ("/console/topics/sec-topic/grow", {"queues": "4"}),
        ("/console/applications", {"kind": "topic", "name": "viewer-app", "project": "default"}),
        ("/console/users", {"name": "x", "password": "long-password", "role": "admin"}),
    ]:
        assert viewer.post(path, data={**form, "csrf": token}).status_code == 403, path
    topic = users.admin("GET", "/admin/topics/sec-topic")
    assert topic["queues"] == 1
    assert viewer.get("/console/users").status_code == 403


def test_a_member_sees_only_their_projects(users: ConsoleServer) -> None:
    member = sign_in(users, "mona")  # member of project "elsewhere" only
    page = member.get("/console/topics").text
    assert "sec-topic" not in page and "No topics." in page
    assert member.get("/console/messages?topic=sec-topic").status_code == 403
    owner = sign_in(users, "otto")
    assert "sec-topic" in owner.get("/console/topics").text


def test_signing_out_ends_the_session(users: ConsoleServer) -> None:
    client = sign_in(users, "vera")
    assert client.post("/console/signout", data={"csrf": csrf_of(client)}).status_code == 303
    assert client.get("/console/topics").status_code == 303


def test_sessions_do_not_outlive_a_deleted_user(users: ConsoleServer) -> None:
    users.add_user("temp", "viewer")
    client = sign_in(users, "temp")
    assert client.get("/console/topics").status_code == 200
    admin = sign_in(users, "admin")
    assert admin.post("/console/users/temp/delete", data={"csrf": csrf_of(admin)}).status_code == 303
    assert client.get("/console/topics").status_code == 303


def test_the_user_cli_lists_and_refuses_clearly(users: ConsoleServer) -> None:
    from tests.console.conftest import user_cli

    listed = user_cli(users.data_dir, "list")
    assert listed.returncode == 0 and "vera\tpassword\tviewer@*" in listed.stdout
    dup = user_cli(users.data_dir, "add", "vera", "--role", "viewer", "--password-stdin", password=PASSWORD)
    assert dup.returncode == 2 and "user vera already exists" in dup.stderr
    short = user_cli(users.data_dir, "passwd", "vera", "--password-stdin", password="short")
    assert short.returncode == 2 and "at least 8 characters" in short.stderr
