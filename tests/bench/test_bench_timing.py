"""The timing harness with fake contenders and a fake clock: interleaving, medians, budgets.

No test measures real time: each fake contender advances a fake clock by a fixed amount, so
every sample is known exactly.
"""

import math

import numpy as np
import pytest

from ember.bench.timing import (Series, calls_per_sample, compare_outputs, measure_interleaved,
                                rotated)


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)  # settling takes no fake time: it is never timed


def fake_contender(clock: FakeClock, name: str, costs: list[float], log: list[str]):
    """Each call costs the next value of ``costs`` (seconds, cycling) and logs its name."""
    calls = {"count": 0}

    def run():
        clock.now += costs[calls["count"] % len(costs)]
        calls["count"] += 1
        log.append(name)

    return run


def measure(contenders, rounds, warmup=0, **kwargs):
    clock = kwargs.pop("clock")
    return measure_interleaved(contenders, rounds, warmup, clock=clock, sleep=clock.sleep,
                               min_sample_seconds=0.0, **kwargs)


def test_rotation_puts_every_contender_in_every_position():
    names = ["a", "b", "c"]
    orders = [rotated(names, r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    for position in range(3):
        assert sorted(order[position] for order in orders) == names
    assert rotated(names, 4) == rotated(names, 1)
    assert rotated([], 5) == []


def test_one_sample_per_contender_per_round_in_rotated_order():
    clock, log = FakeClock(), []
    contenders = {name: fake_contender(clock, name, [0.001], log) for name in "abc"}
    result = measure(contenders, rounds=4, warmup=2, clock=clock)
    assert result.orders == [rotated("abc", r) for r in range(4)]
    # warm-up (2 calls each, in order), one calibration call each, then the rounds
    timed = log[2 * 3 + 3:]
    assert timed == [name for order in result.orders for name in order]
    assert all(len(series.samples_ms) == 4 for series in result.series.values())
    assert len(clock.sleeps) == 12  # a settling pause before every sample


def test_medians_and_spread_come_from_the_samples():
    clock, log = FakeClock(), []
    contenders = {"fast": fake_contender(clock, "fast", [0.001, 0.002, 0.100], log),
                  "slow": fake_contender(clock, "slow", [0.010], log)}
    result = measure(contenders, rounds=5, clock=clock)
    fast = result.series["fast"]
    # the calibration call took the first cost, so the samples cycle from the second
    assert fast.samples_ms == pytest.approx([2.0, 100.0, 1.0, 2.0, 100.0])
    assert fast.median == pytest.approx(2.0)  # robust to the 100 ms outliers
    assert fast.minimum == pytest.approx(1.0)
    assert result.series["slow"].median == pytest.approx(10.0)
    assert result.series["slow"].spread == pytest.approx(0.0)


def test_a_sample_averages_back_to_back_calls_of_fast_contenders():
    clock = FakeClock()
    run = fake_contender(clock, "x", [0.0001], [])
    assert calls_per_sample(run, clock, min_sample_seconds=0.002, max_calls=1000) == 20
    assert calls_per_sample(run, clock, min_sample_seconds=0.002, max_calls=5) == 5
    slow = fake_contender(clock, "y", [1.0], [])
    assert calls_per_sample(slow, clock, min_sample_seconds=0.002) == 1

    clock, log = FakeClock(), []
    contenders = {"x": fake_contender(clock, "x", [0.0001], log)}
    result = measure_interleaved(contenders, 3, 0, clock=clock, sleep=clock.sleep,
                                 min_sample_seconds=0.002)
    series = result.series["x"]
    assert series.calls_per_sample == 20
    assert series.samples_ms == pytest.approx([0.1, 0.1, 0.1])  # per call, not per sample
    assert log.count("x") == 1 + 3 * 20


def test_budget_drops_a_slow_contender_after_min_rounds():
    clock, log = FakeClock(), []
    contenders = {"slow": fake_contender(clock, "slow", [2.0], log),
                  "fast": fake_contender(clock, "fast", [0.001], log)}
    result = measure(contenders, rounds=10, clock=clock, budget_seconds=1.0, min_rounds=3)
    assert len(result.series["slow"].samples_ms) == 3
    assert len(result.series["fast"].samples_ms) == 10
    assert all(order == ["fast"] for order in result.orders[3:])


def test_series_of_few_samples():
    assert math.isnan(Series().median)
    assert math.isnan(Series([1.0, 2.0, 3.0]).spread)  # under four samples: no quartiles
    assert Series([1.0, 2.0, 3.0, 4.0, 100.0]).median == 3.0
    summary = Series([1.0, 2.0]).summary()
    assert summary["samples_ms"] == [1.0, 2.0] and summary["spread"] is None


def test_compare_outputs_is_allclose():
    want = [np.array([1.0, 100.0, 0.0], dtype=np.float32)]
    assert compare_outputs(want, [want[0].copy()]).ok
    close = [np.array([1.00005, 100.005, 5e-6], dtype=np.float32)]
    assert compare_outputs(want, close, rtol=1e-4, atol=1e-5).ok
    far = [np.array([1.001, 100.0, 0.0], dtype=np.float32)]
    verdict = compare_outputs(want, far, rtol=1e-4, atol=1e-5)
    assert not verdict.ok
    assert verdict.max_abs_diff == pytest.approx(1e-3, rel=1e-3)
    assert "exceeds" in verdict.message
    # np.allclose is the independent oracle
    for got in (close, far):
        assert compare_outputs(want, got).ok == np.allclose(got[0], want[0], 1e-4, 1e-5)


def test_compare_outputs_reports_shape_count_and_nan_problems():
    want = [np.zeros((2, 3), np.float32)]
    assert "shape" in compare_outputs(want, [np.zeros((3, 2), np.float32)]).message
    assert "output(s)" in compare_outputs(want, []).message
    nan = np.zeros((2, 3), np.float32)
    nan[0, 0] = np.nan
    assert not compare_outputs(want, [nan]).ok
    assert compare_outputs([nan], [nan.copy()]).ok
    inf = np.full((2, 3), np.inf, np.float32)
    assert compare_outputs([inf], [inf.copy()]).ok
