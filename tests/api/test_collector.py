"""The serving process's garbage collector settings (api/collector.py)."""

from __future__ import annotations

import gc

from mqgate.api.collector import THRESHOLDS, tune_for_serving


def test_serving_collects_the_young_generation_far_less_often_than_the_default() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)  # CPython's default
        tune_for_serving()
        assert gc.get_threshold() == THRESHOLDS and THRESHOLDS[0] >= 10 * 700
    finally:
        gc.set_threshold(*before)
