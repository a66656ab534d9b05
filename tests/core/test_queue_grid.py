"""The store queue numbering of a topic that grows (core/layout.py), tested directly."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqgate.core.layout import Layout, QueueGrid, grown, retry_topic


@st.composite
def histories(draw: st.DrawFn) -> tuple[tuple[int, int], ...]:
    queues, lanes = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    shapes = [(queues, lanes)]
    for _ in range(draw(st.integers(0, 4))):
        queues += draw(st.integers(0, 3))
        lanes += draw(st.integers(0, 2))
        shapes = list(grown(tuple(shapes), queues, lanes))
    return tuple(shapes)


@given(histories())
def test_every_cell_has_one_store_queue_and_old_cells_keep_theirs(
    shapes: tuple[tuple[int, int], ...],
) -> None:
    grid = QueueGrid(shapes)
    queues, lanes = shapes[-1]
    numbers = {(lane, q): grid.store_queue(lane, q) for lane in range(lanes) for q in range(queues)}
    assert sorted(numbers.values()) == list(range(queues * lanes)) == list(range(grid.size))
    for (lane, _q), n in numbers.items():
        assert grid.lane_of(n) == lane
    for end in range(1, len(shapes)):
        before = QueueGrid(shapes[:end])
        bq, bl = shapes[end - 1]
        assert all(before.store_queue(lane, q) == numbers[lane, q] for lane in range(bl) for q in range(bq))


@given(histories())
def test_a_consumer_table_only_grows_at_the_end(shapes: tuple[tuple[int, int], ...]) -> None:
    slots = [
        [Layout("c", "t", QueueGrid(shapes[:end])).slot(i) for i in range(QueueGrid(shapes[:end]).size + 2)]
        for end in range(1, len(shapes) + 1)
    ]
    for shorter, longer in itertools.pairwise(slots):
        assert longer[: len(shorter)] == shorter
    grid = QueueGrid(shapes)
    layout = Layout("c", "t", grid)
    assert layout.slot(grid.first_queues).topic == retry_topic("c")
    for n in range(grid.size):
        assert layout.slot(grid.table_index(n)).queue == n


def test_a_single_shape_numbers_lane_by_lane_as_before() -> None:
    grid = QueueGrid(((4, 3),))
    assert [grid.store_queue(lane, q) for lane in range(3) for q in range(4)] == list(range(12))


def test_growing_never_shrinks() -> None:
    with pytest.raises(ValueError, match="only grows"):
        grown(((4, 2),), 3, 2)
    with pytest.raises(ValueError, match="only grows"):
        grown(((4, 2),), 4, 1)
    assert grown(((4, 2),), 4, 2) == ((4, 2),)
    assert grown(((4, 2),), 6, 2) == ((4, 2), (6, 2))
