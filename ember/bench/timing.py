"""Interleaved timing and output agreement: the measuring half of ``ember bench``.

On a shared 2-core machine the host's load drifts by tens of percent within a minute.  Timing
contender A for a minute and then B for a minute would charge that drift to one of them, so
every round takes ONE sample of EACH contender, and the order rotates every round (A B C,
B C A, C A B, ...): no contender always runs right after another has warmed or thrashed the
caches, and a slow phase of the host falls into all series alike.  The figures to read are
the medians (robust to the bimodal samples a lost core produces) and their ratios within one
run; every sample is kept for the JSON.

A sample of a sub-millisecond model averages enough back-to-back calls to last
``min_sample_seconds``, so timer granularity and scheduler ticks do not dominate it.

A contender is a callable, timed here around its calls, or an object that times its own
calls (``time_calls(n)`` -> seconds: a contender in a worker process of its own, see
:mod:`ember.bench.isolation`).  When all contenders share one process, each brings its own
thread pool (libgomp for torch and
ember, ORT's, OpenVINO's TBB).  After a call those workers spin for a while before they
sleep; on 2 cores, the next contender's sample would run against them and lose a core.  So
before every sample the harness pauses ``settle_seconds`` (untimed) and lets the previous
contender's workers go to sleep: each sample starts on quiet cores, as it would in a
deployment where that runtime is alone, while the calls within a sample keep each runtime's
own spinning behaviour.

Nothing here asserts on a time: the tests drive this module with a fake clock.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

MIN_SAMPLE_SECONDS = 0.002
MAX_CALLS_PER_SAMPLE = 200
# A contender over its time budget still gets this many samples (a median needs a few).
MIN_ROUNDS = 3
# Untimed pause before each sample, longer than the thread pools' spin-before-sleep.
SETTLE_SECONDS = 0.01


@dataclass
class Series:
    """The per-call latencies (ms) of one contender, one value per round it took part in."""

    samples_ms: list[float] = field(default_factory=list)
    calls_per_sample: int = 1

    @property
    def median(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else math.nan

    @property
    def minimum(self) -> float:
        return min(self.samples_ms) if self.samples_ms else math.nan

    @property
    def spread(self) -> float:
        """Interquartile range over the median: this series' noise (nan under 4 samples)."""
        if len(self.samples_ms) < 4:
            return math.nan
        q1, _, q3 = statistics.quantiles(self.samples_ms, n=4)
        return (q3 - q1) / self.median if self.median else math.nan

    def summary(self) -> dict[str, Any]:
        return {"median_ms": _finite(self.median), "min_ms": _finite(self.minimum),
                "spread": _finite(self.spread), "calls_per_sample": self.calls_per_sample,
                "samples_ms": list(self.samples_ms)}


@dataclass
class Measurement:
    """The series of every contender and the order each round ran them in."""

    series: dict[str, Series]
    orders: list[list[str]] = field(default_factory=list)


def _finite(value: float) -> float | None:
    return None if value is None or math.isnan(value) else value


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """The order of round ``round_index``: ``names`` rotated left by the round number."""
    if not names:
        return []
    shift = round_index % len(names)
    return list(names[shift:]) + list(names[:shift])


def time_calls(run: Callable[[], Any], calls: int,
               clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds ``calls`` back-to-back calls of ``run`` take: measured by the contender
    itself when it can (``run.time_calls``, a worker process), else around the calls here."""
    own = getattr(run, "time_calls", None)
    if own is not None:
        return float(own(calls))
    start = clock()
    for _ in range(calls):
        run()
    return clock() - start


def calls_per_sample(run: Callable[[], Any], clock: Callable[[], float] = time.perf_counter,
                     min_sample_seconds: float = MIN_SAMPLE_SECONDS,
                     max_calls: int = MAX_CALLS_PER_SAMPLE) -> int:
    """How many back-to-back calls make one sample last ``min_sample_seconds``."""
    once = time_calls(run, 1, clock)
    if once <= 0:
        return max_calls if min_sample_seconds > 0 else 1
    return max(1, min(max_calls, math.ceil(min_sample_seconds / once)))


def measure_interleaved(contenders: Mapping[str, Callable[[], Any]], rounds: int,
                        warmup: int = 1, *, clock: Callable[[], float] = time.perf_counter,
                        min_sample_seconds: float = MIN_SAMPLE_SECONDS,
                        max_calls: int = MAX_CALLS_PER_SAMPLE,
                        budget_seconds: float | None = None,
                        min_rounds: int = MIN_ROUNDS,
                        settle_seconds: float = SETTLE_SECONDS,
                        sleep: Callable[[float], None] = time.sleep) -> Measurement:
    """Warm every contender up, then take ``rounds`` rounds of one sample each, rotated.

    ``budget_seconds`` bounds the time one contender may spend in timed samples: a contender
    that has used it up (and has ``min_rounds`` samples) sits out the remaining rounds, so a
    contender 100x slower than the rest cannot stretch a run to an hour.  Each sample
    follows an untimed pause of ``settle_seconds`` (see the module docstring).  GC is off
    while timing.
    """
    names = list(contenders)
    series = {name: Series() for name in names}
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    for name in names:
        series[name].calls_per_sample = calls_per_sample(contenders[name], clock,
                                                         min_sample_seconds, max_calls)
    spent = {name: 0.0 for name in names}
    orders: list[list[str]] = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for round_index in range(rounds):
            active = [name for name in names
                      if budget_seconds is None or spent[name] < budget_seconds
                      or len(series[name].samples_ms) < min_rounds]
            if not active:
                break
            order = rotated(active, round_index)
            orders.append(order)
            for name in order:
                run, calls = contenders[name], series[name].calls_per_sample
                if settle_seconds > 0:
                    sleep(settle_seconds)
                elapsed = time_calls(run, calls, clock)
                spent[name] += elapsed
                series[name].samples_ms.append(elapsed * 1e3 / calls)
    finally:
        if gc_was_enabled:
            gc.enable()
    return Measurement(series, orders)


# --------------------------------------------------------------------------- agreement


@dataclass
class Agreement:
    """How a contender's outputs compare with the reference (PyTorch eager).

    ``worst`` is the largest ``|got - want| / (atol + rtol * |want|)`` over all elements:
    at most 1 means ``np.allclose`` holds everywhere.
    """

    ok: bool
    max_abs_diff: float | None = None
    worst: float | None = None
    message: str = ""


def compare_outputs(want: Sequence[np.ndarray], got: Sequence[np.ndarray],
                    rtol: float = 1e-4, atol: float = 1e-5) -> Agreement:
    """Compare output lists positionally, as ``np.allclose(got, want, rtol, atol)``."""
    if len(want) != len(got):
        return Agreement(False, message=f"{len(got)} output(s), the reference has {len(want)}")
    max_abs, worst = 0.0, 0.0
    problems = []
    for index, (expected, actual) in enumerate(zip(want, got)):
        expected, actual = np.asarray(expected), np.asarray(actual)
        if expected.shape != actual.shape:
            problems.append(f"output {index}: shape {actual.shape}, reference {expected.shape}")
            continue
        if expected.size == 0:
            continue
        e, a = expected.astype(np.float64), actual.astype(np.float64)
        # Equal values (infinities included) and NaN against NaN agree.
        equal = (a == e) | (np.isnan(e) & np.isnan(a))
        with np.errstate(invalid="ignore"):
            diff = np.where(equal, 0.0, np.abs(a - e))
        if np.isnan(diff).any():
            problems.append(f"output {index}: NaN where the reference has a number (or back)")
            continue
        max_abs = max(max_abs, float(diff.max()))
        worst = max(worst, float((diff / (atol + rtol * np.abs(e))).max()))
    if problems:
        return Agreement(False, message="; ".join(problems))
    ok = worst <= 1.0
    message = "" if ok else (f"max |diff| {max_abs:.3g} exceeds rtol {rtol:g} / atol {atol:g} "
                             f"({worst:.3g}x the tolerance)")
    return Agreement(ok, max_abs, worst, message)
