"""The static memory planner (ember/passes/memory_plan.py), checked on seeded random interval
sets (a property test without hypothesis) and on small hand-made ones:

- tensors whose lifetimes overlap never share bytes;
- every offset is 64-byte aligned;
- tensors with disjoint lifetimes do reuse memory;
- the arena is never smaller than the peak of live bytes, nor than the furthest tensor end.
"""

from __future__ import annotations

import numpy as np
import pytest

from ember.passes.memory_plan import ALIGNMENT, Interval, MemoryPlan, align, plan_memory

SIZES = [0, 1, 7, 63, 64, 65, 100, 1000, 4096, 12345]


def _random_intervals(seed: int) -> list[Interval]:
    rng = np.random.default_rng(seed)
    count = int(rng.integers(1, 60))
    horizon = int(rng.integers(1, 40))
    intervals = []
    for index in range(count):
        start = int(rng.integers(0, horizon))
        end = start + int(rng.integers(0, 12))
        nbytes = int(rng.choice(SIZES)) if rng.random() < 0.5 else int(rng.integers(0, 50000))
        intervals.append(Interval(f"t{index}", nbytes, start, end))
    return intervals


def _lifetimes_overlap(a: Interval, b: Interval) -> bool:
    return a.start <= b.end and b.start <= a.end


def _check_plan(intervals: list[Interval], plan: MemoryPlan) -> None:
    assert set(plan.offsets) == {i.name for i in intervals}
    for interval in intervals:
        offset = plan.offsets[interval.name]
        assert offset >= 0 and offset % ALIGNMENT == 0, interval
        assert offset + interval.nbytes <= plan.workspace_size, interval
    for i, a in enumerate(intervals):
        for b in intervals[i + 1:]:
            if not _lifetimes_overlap(a, b):
                continue
            # Every tensor owns at least one byte, so that two live tensors never alias.
            a_lo, a_hi = plan.offsets[a.name], plan.offsets[a.name] + max(a.nbytes, 1)
            b_lo, b_hi = plan.offsets[b.name], plan.offsets[b.name] + max(b.nbytes, 1)
            assert a_hi <= b_lo or b_hi <= a_lo, (a, b, plan.offsets[a.name],
                                                  plan.offsets[b.name])
    if intervals:
        last = max(i.end for i in intervals)
        peak = max(sum(i.nbytes for i in intervals if i.start <= step <= i.end)
                   for step in range(last + 1))
        assert plan.workspace_size >= peak


@pytest.mark.parametrize("seed", range(0, 400, 20))
def test_random_interval_sets(seed):
    for offset in range(20):  # 400 random sets in 20 test cases
        intervals = _random_intervals(seed + offset)
        _check_plan(intervals, plan_memory(intervals))


def test_random_plans_reuse_memory():
    # On random sets with many disjoint lifetimes the arena is far below the no-reuse total.
    saved = 0
    for seed in range(50):
        intervals = _random_intervals(1000 + seed)
        plan = plan_memory(intervals)
        naive = sum(align(max(i.nbytes, 1)) for i in intervals)
        assert plan.workspace_size <= naive
        saved += naive - plan.workspace_size
    assert saved > 0


def test_disjoint_lifetimes_share_one_buffer():
    intervals = [Interval(f"t{step}", 1000, step, step) for step in range(10)]
    plan = plan_memory(intervals)
    assert set(plan.offsets.values()) == {0}
    assert plan.workspace_size == align(1000)


def test_chain_reuses_the_buffer_two_steps_back():
    # a -> b -> c -> d, each read only by the next node: a and c can share, b and d can share.
    intervals = [Interval("a", 256, 0, 1), Interval("b", 256, 1, 2), Interval("c", 256, 2, 3),
                 Interval("d", 256, 3, 4)]
    plan = plan_memory(intervals)
    _check_plan(intervals, plan)
    assert plan.offsets["a"] == plan.offsets["c"] and plan.offsets["b"] == plan.offsets["d"]
    assert plan.workspace_size == 512


def test_freed_gap_is_reused_best_fit():
    # big and small die at step 1; at step 2 a small tensor fits the small gap exactly.
    intervals = [Interval("big", 1024, 0, 1), Interval("small", 64, 0, 1),
                 Interval("keep", 128, 0, 5), Interval("later", 64, 2, 3)]
    plan = plan_memory(intervals)
    _check_plan(intervals, plan)
    assert plan.offsets["later"] in (plan.offsets["big"], plan.offsets["small"])
    assert plan.workspace_size == 1024 + 64 + 128


def test_overlapping_lifetimes_get_distinct_aligned_slots():
    intervals = [Interval("a", 1, 0, 3), Interval("b", 0, 1, 2), Interval("c", 65, 2, 2)]
    plan = plan_memory(intervals)
    _check_plan(intervals, plan)
    assert len(set(plan.offsets.values())) == 3
    assert plan.workspace_size == 64 + 64 + 128


def test_no_intervals_no_workspace():
    plan = plan_memory([])
    assert plan.offsets == {} and plan.workspace_size == 0


def test_align_and_summary():
    assert [align(n) for n in (0, 1, 63, 64, 65, 128)] == [0, 64, 64, 64, 128, 128]
    assert align(5, 4) == 8
    intervals = [Interval("a", 100, 0, 0), Interval("b", 100, 1, 1)]
    summary = plan_memory(intervals).summary(intervals)
    assert "workspace 128 bytes for 2 tensors" in summary and "256 without reuse" in summary
