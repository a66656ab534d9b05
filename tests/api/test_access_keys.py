"""Access keys through the admin API and the CLI on a real gateway (issue 30): made for an
existing project with the secret shown once (never listed, never in the audit log), 4xx naming
the field, listed in pages, revoked; a key the API made signs a request (botocore's signer)
that verifies with the secret the gateway sealed."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.auth
import httpx
import pytest
import sqlalchemy as sa
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from mqgate.accesskeys.service import AccessKeys
from mqgate.sqs import sigv4
from tests.conftest import MQGATE, Server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("access-keys") / "data").start()
    try:
        srv.admin("POST", "/admin/projects", name="shop")
        srv.admin("POST", "/admin/projects", name="ads")
        yield srv
    finally:
        srv.stop()


def call(srv: Server, method: str, path: str, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {srv.admin_token}"}
    return httpx.request(method, srv.url + path, headers=headers, timeout=30, **kwargs)


def error_of(response: httpx.Response) -> tuple[int, str, str | None]:
    body = response.json()
    return response.status_code, body["result"]["code"], body["result"]["field"]


def cli(srv: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MQGATE, *args, "--url", srv.url],
        env={**os.environ, "MQGATE_ADMIN_TOKEN": srv.admin_token},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_key_is_made_for_a_project_and_its_secret_is_shown_once(server: Server) -> None:
    made = call(server, "POST", "/admin/access-keys", json={"name": "shop-orders", "project": "shop"})
    assert made.status_code == 200, made.text
    key = made.json()["result"]
    assert set(key) == {"name", "project", "account", "accessKeyId", "secretAccessKey", "createdMs"}
    assert key["accessKeyId"].startswith("MQGA") and len(key["accessKeyId"]) == 20
    assert len(key["secretAccessKey"]) == 40 and len(key["account"]) == 12
    other = call(server, "POST", "/admin/access-keys", data={"name": "shop-billing", "project": "shop"})
    assert other.json()["result"]["account"] == key["account"]  # form bodies too; one account per project

    listed = call(server, "GET", "/admin/access-keys")
    assert key["secretAccessKey"] not in listed.text and "secretAccessKey" not in listed.text
    mine = next(k for k in listed.json()["result"]["accessKeys"] if k["name"] == "shop-orders")
    assert mine == {k: v for k, v in key.items() if k != "secretAccessKey"} | {"revoked": False}

    # The audit log names the change and never holds the secret.
    engine = sa.create_engine(f"sqlite:///{server.data_dir / 'registry.db'}")
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT action, target, after FROM mqgate_console_audit WHERE action LIKE 'access_key.%'"
                )
            ).all()
    finally:
        engine.dispose()
    assert ("access_key.create", "shop-orders") in {(r[0], r[1]) for r in rows}
    assert all(key["secretAccessKey"] not in (r[2] or "") for r in rows)


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({"name": "k-unknown", "project": "nowhere"}, 404, "not_found", "project"),
        ({"name": "bad name!", "project": "shop"}, 400, "bad_request", "name"),
        ({"name": "k-missing"}, 400, "bad_request", "project"),
        ({"name": "k-extra", "project": "shop", "secret": "mine"}, 400, "bad_request", "secret"),
    ],
)
def test_bad_input_is_refused_naming_the_field(
    server: Server, body: dict[str, str], status: int, code: str, field: str
) -> None:
    assert error_of(call(server, "POST", "/admin/access-keys", json=body)) == (status, code, field)


def test_a_taken_name_is_409_and_an_unknown_one_cannot_be_revoked(server: Server) -> None:
    assert (
        call(server, "POST", "/admin/access-keys", json={"name": "dup", "project": "shop"}).status_code == 200
    )
    taken = call(server, "POST", "/admin/access-keys", json={"name": "dup", "project": "ads"})
    assert error_of(taken) == (409, "already_exists", "name")
    assert error_of(call(server, "DELETE", "/admin/access-keys/never")) == (404, "not_found", "name")
    assert error_of(call(server, "GET", "/admin/access-keys", params={"project": "nowhere"})) == (
        404,
        "not_found",
        "project",
    )
    assert call(server, "GET", "/admin/access-keys").status_code == 200
    no_token = httpx.get(server.url + "/admin/access-keys", timeout=30)
    assert no_token.status_code == 401


def test_keys_are_listed_in_pages_by_name_and_by_project(server: Server) -> None:
    for i in range(5):
        assert call(
            server, "POST", "/admin/access-keys", json={"name": f"ads-{i}", "project": "ads"}
        ).is_success
    names: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"project": "ads", "limit": 2, **({"cursor": cursor} if cursor else {})}
        page = call(server, "GET", "/admin/access-keys", params=params).json()["result"]
        names += [k["name"] for k in page["accessKeys"]]
        assert all(k["project"] == "ads" for k in page["accessKeys"])
        pages += 1
        cursor = page.get("next")
        if cursor is None:
            break
    assert names == sorted(names) and set(names) >= {f"ads-{i}" for i in range(5)} and pages >= 3
    bad = call(server, "GET", "/admin/access-keys", params={"cursor": "garbage!"})
    assert error_of(bad) == (400, "bad_request", "cursor")


def test_a_revoked_key_is_listed_as_revoked(server: Server) -> None:
    call(server, "POST", "/admin/access-keys", json={"name": "to-revoke", "project": "shop"})
    revoked = call(server, "DELETE", "/admin/access-keys/to-revoke")
    assert revoked.status_code == 200
    key = revoked.json()["result"]
    assert key["revoked"] is True and key["revokedMs"] >= key["createdMs"]
    again = call(server, "DELETE", "/admin/access-keys/to-revoke").json()["result"]
    assert again["revokedMs"] == key["revokedMs"]
    listed = call(server, "GET", "/admin/access-keys", params={"project": "shop"}).json()["result"]
    assert next(k for k in listed["accessKeys"] if k["name"] == "to-revoke")["revoked"] is True


def test_a_key_made_by_the_api_signs_requests_that_verify(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = call(server, "POST", "/admin/access-keys", json={"name": "signer", "project": "shop"}).json()[
        "result"
    ]
    at = datetime.datetime(2025, 6, 1, 12, 0, 0)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: at)
    request = AWSRequest(
        method="POST",
        url=server.url + "/",
        data=b'{"QueueNamePrefix": "x"}',
        headers={"X-Amz-Target": "AmazonSQS.ListQueues", "Content-Type": "application/x-amz-json-1.0"},
    )
    credentials = Credentials(key["accessKeyId"], key["secretAccessKey"])
    botocore.auth.SigV4Auth(credentials, "sqs", "us-east-1").add_auth(request)
    headers = {k.lower().encode(): v.encode() for k, v in request.headers.items()}
    headers[b"host"] = server.url.removeprefix("http://").encode()

    # A gateway's view of the registry: the secret sealed with the gateway's secret opens.
    secret = (Path(server.data_dir) / "secret.key").read_text().strip().encode()
    engine = sa.create_engine(f"sqlite:///{server.data_dir / 'registry.db'}")
    try:
        keys = AccessKeys(engine, secret)

        def verify() -> sigv4.Verified:
            return sigv4.verify(
                "POST",
                "/",
                b"",
                headers,
                request.body,
                keys.secret_for,
                at.replace(tzinfo=datetime.UTC).timestamp(),
            )

        asyncio.run(keys.ready(key["accessKeyId"]))
        assert verify().access_key_id == key["accessKeyId"]
        active = keys.active(key["accessKeyId"])
        assert active is not None and active.account == key["account"]
        call(server, "DELETE", "/admin/access-keys/signer")
        keys.refresh_s = 0.0  # this copy's next lookup checks
        asyncio.run(keys.ready(key["accessKeyId"]))
        with pytest.raises(sigv4.InvalidClientTokenId):
            verify()
    finally:
        engine.dispose()


def test_the_cli_creates_lists_and_revokes(server: Server) -> None:
    made = cli(server, "access-key", "create", "cli-key", "--project", "shop")
    assert made.returncode == 0, made.stderr
    lines = made.stdout.splitlines()
    assert lines[0].startswith("access key cli-key created for project shop (account ")
    assert lines[1].startswith("aws_access_key_id = MQGA") and len(lines[2].split(" = ")[1]) == 40
    as_json = json.loads(cli(server, "--json", "access-key", "list", "--project", "shop").stdout)
    assert "cli-key" in {k["name"] for k in as_json["accessKeys"]} and "next" not in as_json
    table = cli(server, "access-key", "list").stdout.splitlines()
    assert table[0].split() == ["name", "project", "accessKeyId", "account", "createdMs", "revokedMs"]
    assert lines[2].split(" = ")[1] not in "\n".join(table)
    revoked = cli(server, "access-key", "revoke", "cli-key")
    assert revoked.returncode == 0 and revoked.stdout.strip().endswith("revoked")
    refused = cli(server, "access-key", "create", "cli-key2", "--project", "nowhere")
    assert refused.returncode == 1 and "project nowhere does not exist" in refused.stderr
