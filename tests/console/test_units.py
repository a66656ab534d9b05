"""The console's rules without a server: passwords, roles, sessions' expiry, the sign-in
throttle, the audit filter, sealed tokens (SQLite files of the test's own)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from mqgate.console.accounts import Accounts
from mqgate.console.applications import Applications, seal, unseal
from mqgate.console.audit import AuditFilter, AuditLog
from mqgate.console.passwords import hash_password, verify_password
from mqgate.console.roles import Grant, Principal, check_grant
from mqgate.console.sessions import SessionPolicy, Sessions
from mqgate.console.tables import create_tables, engine_for
from mqgate.errors import AlreadyExists, BadRequest


@pytest.fixture
def engine(tmp_path: Path) -> sa.Engine:
    e = engine_for(f"sqlite:///{tmp_path / 'registry.db'}")
    create_tables(e)
    return e


def test_passwords_are_salted_scrypt_and_verify() -> None:
    a, b = hash_password("s3cret-pass"), hash_password("s3cret-pass")
    assert a != b and a.startswith("scrypt$32768$8$1$")
    assert verify_password("s3cret-pass", a) and not verify_password("s3cret-pasS", a)
    assert not verify_password("anything", "") and not verify_password("x", "garbage")


def test_roles_rise_per_project_and_star_means_every_project() -> None:
    owner = Principal("o", (Grant("owner", "shop"), Grant("viewer", "*")))
    assert owner.can_change("shop") and not owner.can_change("billing")
    assert owner.can_view("billing") and not owner.can_apply("billing")
    member = Principal("m", (Grant("member", "shop"),))
    assert member.visible(["shop", "billing"]) == ["shop"] and not member.can_change("shop")
    assert Principal("a", (Grant("admin", "*"),)).can_change("anything")
    assert check_grant("admin", "shop") is not None and check_grant("boss", "*") is not None


def test_unknown_user_and_wrong_password_take_the_same_time(engine: sa.Engine) -> None:
    accounts = Accounts(engine)
    accounts.add("alice", "alice-password", "viewer", "*")

    def took(name: str) -> float:
        # This thread's CPU time, not the wall clock: the work done is what must not differ,
        # and a loaded machine stretches wall-clock time at random (CI failed on 0.30 s / 0.09 s).
        started = time.thread_time()
        assert accounts.verify(name, "not-her-password") is None
        return time.thread_time() - started

    unknown = statistics.median(took("nobody") for _ in range(5))
    wrong = statistics.median(took("alice") for _ in range(5))
    assert 0.5 < unknown / wrong < 2.0, (unknown, wrong)
    assert accounts.verify("alice", "alice-password") is not None


def test_accounts_refuse_short_passwords_duplicates_and_bad_grants(engine: sa.Engine) -> None:
    accounts = Accounts(engine)
    with pytest.raises(BadRequest):
        accounts.add("bob", "short", "viewer", "*")
    accounts.add("bob", "long-enough", "member", "shop")
    with pytest.raises(AlreadyExists):
        accounts.add("bob", "long-enough", "member", "shop")
    with pytest.raises(BadRequest):
        accounts.grant("bob", "admin", "shop")
    accounts.grant("bob", "owner", "billing")
    assert {(g.role, g.project) for g in accounts.get("bob").grants} == {
        ("member", "shop"),
        ("owner", "billing"),
    }


def test_sessions_end_when_idle_or_too_old_and_with_a_new_password(engine: sa.Engine) -> None:
    Accounts(engine).add("carol", "carol-password", "viewer", "*")
    sessions = Sessions(engine, SessionPolicy(idle_ms=1000, lifetime_ms=5000, touch_every_ms=0))
    value, s = sessions.create("carol", 10_000)
    assert sessions.find(value, 10_900) == s
    assert sessions.find(value, 11_800) == s  # touched at 10_900: not idle yet
    assert sessions.find(value, 12_900) is None  # idle for 1.1 s
    value, _ = sessions.create("carol", 20_000)
    for now in range(20_500, 25_000, 500):
        assert sessions.find(value, now) is not None
    assert sessions.find(value, 25_000) is None  # lived 5 s
    value, _ = sessions.create("carol", 30_000)
    Accounts(engine).set_password("carol", "another-password")
    assert sessions.find(value, 30_001) is None


def test_audit_filters_by_actor_action_target_and_project(engine: sa.Engine) -> None:
    log = AuditLog(engine)
    log.record("ann", "topic.create", "orders", project="shop", after={"queues": 4})
    log.record("ben", "topic.grow", "orders", project="shop", before={"queues": 4}, after={"queues": 8})
    log.record("ann", "consumer.reset", "billing-c", project="billing", via="api")
    assert [e.action for e in log.query(AuditFilter(actor="ann"))] == ["consumer.reset", "topic.create"]
    grown = log.query(AuditFilter(action="topic.", target="ord", projects=["shop"]))
    assert [(e.before, e.after) for e in grown] == [({"queues": 4}, {"queues": 8}), (None, {"queues": 4})]
    assert log.query(AuditFilter(projects=["billing"]))[0].via == "api"


def test_a_token_is_sealed_and_given_to_its_applicant_once(engine: sa.Engine) -> None:
    key = b"k" * 32
    assert unseal(key, seal(key, "mqc_abc")) == "mqc_abc"
    with pytest.raises(ValueError):
        unseal(b"x" * 32, seal(key, "mqc_abc"))
    apps = Applications(engine, b"secret")
    app_id = apps.apply("consumer", "c1", "shop", {"topic": "t"}, "gina")
    assert apps.claim(app_id) and not apps.claim(app_id)
    apps.settle(app_id, "approved", "olga", "ok", "mqc_token")
    assert apps.take_token(app_id, "olga") is None  # not the applicant
    assert apps.take_token(app_id, "gina") == "mqc_token"
    assert apps.take_token(app_id, "gina") is None


def test_every_setting_has_a_meaning_from_the_comments_of_settings_py() -> None:
    from mqgate.console.settings_view import help_texts, setting_rows
    from mqgate.settings import Settings, setting_fields

    helps = help_texts()
    missing = [f.name for f in setting_fields() if not helps.get(f.name, "").strip()]
    assert missing == []
    # A group's comment applies to each field of its run, and only to it.
    assert (
        helps["default_queues"] == helps["default_retention_ms"]
        and "dead-lettered" in helps["default_queues"]
    )
    assert helps["failover_check_s"].startswith("Failover between store clusters")
    assert helps["broker_name"] != helps["token_secret"]
    rows = {r.name: r for r in setting_rows(Settings())}
    assert all(r.help for r in rows.values())
    assert (rows["segment_bytes"].value, rows["segment_bytes"].human) == ("67108864", "64.00 MiB")
    assert (rows["default_retention_ms"].value, rows["default_retention_ms"].human) == ("604800000", "7 days")
    assert rows["port"].human == "" and rows["default_queues"].human == ""
