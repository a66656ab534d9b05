"""The sink keeps PostgreSQL sessions per process between micro-batches; tests close them when
each module ends, so none is left to the garbage collector (a ResourceWarning in a later test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mqgate.pipeline.sink import POOL


@pytest.fixture(autouse=True, scope="module")
def close_sink_sessions() -> Iterator[None]:
    yield
    POOL.close_idle()
