"""The console's topic forms (create, grow, apply for a topic) are decoded by the API's request
shapes: a value the API refuses is refused by the console too, with the API's message naming
the same field, and nothing is created or grown."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx
import pytest

from tests.console.conftest import ADMIN_TOKEN, ConsoleServer, csrf_of, sign_in

# (the API's field, the console form's field, a value over the API's limit)
OVER_THE_LIMIT = [
    ("maxPriority", "max_priority", "10"),
    ("maxPriority", "max_priority", "20"),
    ("maxPriority", "max_priority", "-1"),
    ("queues", "queues", "100000"),
    ("queues", "queues", "-3"),
    ("queues", "queues", "0"),
    ("queues", "queues", "1e23"),
]
IDS = [f"{field}={value}" for field, _, value in OVER_THE_LIMIT]


@pytest.fixture
def admin(console: ConsoleServer) -> httpx.Client:
    return sign_in(console, "admin")


def tag(value: str) -> str:
    """A value as part of a topic's name."""
    return re.sub(r"[^a-z0-9]", "x", value.lower())


def api_refusal(console: ConsoleServer, method: str, path: str, form: dict[str, str]) -> tuple[str, str]:
    r = httpx.request(
        method, console.url + path, data=form, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30
    )
    assert r.status_code == 400, r.text
    answer: dict[str, Any] = r.json()
    return answer["message"], answer["result"]["field"]


def console_refusal(r: httpx.Response) -> str:
    assert r.status_code == 400, r.text[:2000]
    found = re.search(r'id="error-message">(.*?)</p>', r.text, re.S)
    assert found is not None, r.text[:2000]
    return html.unescape(re.sub(r"<[^>]+>", "", found.group(1))).strip()


def topics(console: ConsoleServer) -> dict[str, Any]:
    return {t["name"]: t for t in console.admin("GET", "/admin/topics")["topics"]}


@pytest.mark.parametrize(("field", "form_field", "value"), OVER_THE_LIMIT, ids=IDS)
def test_creating_a_topic_over_a_limit_is_refused_as_the_api_refuses_it(
    console: ConsoleServer, admin: httpx.Client, field: str, form_field: str, value: str
) -> None:
    name = f"big-{form_field}-{tag(value)}"
    message, named = api_refusal(console, "POST", "/admin/topics", {"name": name, field: value})
    assert named == field and field in message
    form = {"csrf": csrf_of(admin, "/console/topics"), "name": name, "project": "default", form_field: value}
    assert console_refusal(admin.post("/console/topics", data=form)) == f"{message} ({field})"
    assert name not in topics(console)


@pytest.mark.parametrize(("field", "form_field", "value"), OVER_THE_LIMIT, ids=IDS)
def test_growing_a_topic_over_a_limit_is_refused_as_the_api_refuses_it(
    console: ConsoleServer, admin: httpx.Client, field: str, form_field: str, value: str
) -> None:
    name = f"grow-{form_field}-{tag(value)}"
    console.admin("POST", "/admin/topics", name=name, queues=2)
    message, named = api_refusal(console, "PATCH", f"/admin/topics/{name}", {field: value})
    assert named == field and field in message
    form = {"csrf": csrf_of(admin, "/console/topics"), form_field: value}
    assert console_refusal(admin.post(f"/console/topics/{name}/grow", data=form)) == f"{message} ({field})"
    assert (topics(console)[name]["queues"], topics(console)[name]["maxPriority"]) == (2, 0)


@pytest.mark.parametrize(("field", "form_field", "value"), OVER_THE_LIMIT, ids=IDS)
def test_applying_for_a_topic_over_a_limit_is_refused_as_the_api_refuses_it(
    console: ConsoleServer, admin: httpx.Client, field: str, form_field: str, value: str
) -> None:
    name = f"apply-{form_field}-{tag(value)}"
    message, _ = api_refusal(console, "POST", "/admin/topics", {"name": name, field: value})
    form = {
        "csrf": csrf_of(admin, "/console/applications"),
        "kind": "topic",
        "name": name,
        "project": "default",
        form_field: value,
    }
    assert console_refusal(admin.post("/console/applications", data=form)) == f"{message} ({field})"
    assert name not in admin.get("/console/applications").text


def test_a_topic_within_the_limits_is_created_and_grown_from_the_console(
    console: ConsoleServer, admin: httpx.Client
) -> None:
    csrf = csrf_of(admin, "/console/topics")
    form = {"csrf": csrf, "name": "fits", "project": "default", "queues": "256", "max_priority": "9"}
    assert admin.post("/console/topics", data=form).status_code == 303
    assert (topics(console)["fits"]["queues"], topics(console)["fits"]["maxPriority"]) == (256, 9)
    form = {"csrf": csrf, "name": "grown", "project": "default", "queues": "", "retention_hours": "2"}
    assert admin.post("/console/topics", data=form).status_code == 303
    grown = topics(console)["grown"]
    assert grown["retentionMs"] == 2 * 3600 * 1000 and grown["queues"] == 8  # the default queues
    assert admin.post("/console/topics/grown/grow", data={"csrf": csrf, "queues": "9"}).status_code == 303
    assert topics(console)["grown"]["queues"] == 9


@pytest.mark.parametrize("hours", ["inf", "nan", "-inf"])
def test_a_retention_that_is_not_a_finite_number_is_refused_naming_the_field(
    console: ConsoleServer, admin: httpx.Client, hours: str
) -> None:
    form = {
        "csrf": csrf_of(admin, "/console/topics"),
        "name": "endless",
        "project": "default",
        "retention_hours": hours,
    }
    assert console_refusal(admin.post("/console/topics", data=form)) == (
        "retention_hours must be a finite number (retention_hours)"
    )
    assert "endless" not in topics(console)


@pytest.mark.parametrize("hours", ["-5", "0", "1e23"])
def test_a_retention_out_of_range_is_refused_as_the_api_refuses_its_milliseconds(
    console: ConsoleServer, admin: httpx.Client, hours: str
) -> None:
    """-5 hours was stored as −18,000,000 ms; 0 silently became the default retention."""
    ms = int(float(hours) * 3600 * 1000)
    message, named = api_refusal(console, "POST", "/admin/topics", {"name": "short", "retentionMs": str(ms)})
    assert named == "retentionMs"
    form = {"csrf": csrf_of(admin, "/console/topics"), "name": "short", "project": "default",
            "retention_hours": hours}  # fmt: skip
    assert console_refusal(admin.post("/console/topics", data=form)) == f"{message} (retentionMs)"
    assert "short" not in topics(console)
