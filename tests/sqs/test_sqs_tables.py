"""The SQS table's copies on two gateways (one SQLite registry database): a change through one
is in force on the other once the other's copy is `refresh_s` old (a clock the test moves, no
waiting), and at once on its own; an unchanged table costs a version check, not a reload."""

from __future__ import annotations

import sqlalchemy as sa

from mqgate.sqs.tables import QueueRow, QueueTable
from tests.accesskeys import test_service
from tests.accesskeys.test_service import Clock

engine = test_service.engine  # a SQLite registry database of its own, per test


def test_a_change_on_one_gateway_reaches_the_other_within_refresh_s(engine: sa.Engine) -> None:
    clock = Clock()
    one = QueueTable(engine, clock=clock)
    two = QueueTable(engine, clock=clock, refresh_s=2.0)
    one.put(QueueRow("sqs.1.q", {"DelaySeconds": "0"}, {}, 1, 1))
    assert two.due()
    two.check()
    assert two.get("sqs.1.q") == QueueRow("sqs.1.q", {"DelaySeconds": "0"}, {}, 1, 1)
    assert not two.due()

    one.put(QueueRow("sqs.1.q", {"DelaySeconds": "5"}, {}, 1, 2))
    assert one.get("sqs.1.q") is not None and one.get("sqs.1.q").attributes["DelaySeconds"] == "5"  # type: ignore[union-attr]
    clock.now += 1.0
    assert not two.due()
    assert two.get("sqs.1.q").attributes["DelaySeconds"] == "0"  # type: ignore[union-attr]  # its copy, 1 s old
    clock.now += 1.5
    assert two.due()
    two.check()
    assert two.drops == 1
    assert two.get("sqs.1.q").attributes["DelaySeconds"] == "5"  # type: ignore[union-attr]

    one.delete("sqs.1.q")
    clock.now += 2.0
    two.check()
    assert two.get("sqs.1.q") is None and two.drops == 2

    clock.now += 5.0
    two.check()  # unchanged: the copy stays
    assert two.drops == 2
