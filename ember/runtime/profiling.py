"""Per-step timing of a compiled model: the measuring half of the profiler (numpy only).

``ember_run_profiled`` runs exactly the steps of ``ember_run`` and writes each step's wall
time into an array of doubles (:mod:`ember.driver.entry`).  :func:`measure_steps` calls it
``repeat`` times after ``warmup`` untimed calls and keeps every sample; the figures to read
are the per-step medians, which shrug off the odd sample a scheduler tick or another process
spoils.  Each round also times one ordinary ``run()`` call, the way a caller pays for it
(binding the inputs, allocating the outputs, ``ember_run``): the difference between that and
the sum of the step medians is the overhead outside the kernels.  The two calls alternate so
that a slow phase of the host falls on both alike.

What each step *is* (its kernel, nodes, FLOPs) is the compiler's knowledge, not the
artifact's: :mod:`ember.profile` joins these times with the build.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ember.runtime.errors import InputError


@dataclass(frozen=True)
class StepTimes:
    """What :meth:`CompiledModel.profile` measured.

    ``samples[r, k]`` is step ``k``'s wall time in round ``r`` (seconds); ``call_samples[r]``
    the wall time of round ``r``'s ordinary ``run()`` call.  ``outputs`` are those of the last
    profiled call, so a caller can check that profiling computed what running computes.
    """

    samples: np.ndarray
    call_samples: np.ndarray
    outputs: dict[str, np.ndarray]
    warmup: int

    @property
    def repeat(self) -> int:
        return int(self.samples.shape[0])

    @property
    def step_seconds(self) -> np.ndarray:
        """The median wall time of every step (seconds), in step order."""
        if self.samples.shape[1] == 0:
            return np.zeros(0)
        return np.median(self.samples, axis=0)

    @property
    def call_seconds(self) -> float:
        """The median wall time of a whole ``run()`` call (seconds)."""
        return float(np.median(self.call_samples))

    @property
    def total_seconds(self) -> float:
        """The sum of the step medians: the time spent inside the steps."""
        return float(self.step_seconds.sum())


def check_counts(repeat: int, warmup: int) -> None:
    """Refuse counts that cannot give a median, before anything runs."""
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise InputError(f"repeat must be a positive integer, got {repeat!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise InputError(f"warmup must be a non-negative integer, got {warmup!r}")


def measure_steps(profiled: Callable[[np.ndarray], dict[str, np.ndarray]],
                  plain: Callable[[], object], steps: int, repeat: int,
                  warmup: int) -> StepTimes:
    """Alternate ``plain()`` and ``profiled(slots)`` calls and collect their times.

    ``profiled`` runs the model once, writing each step's seconds into ``slots`` (float64,
    one per step) and returning the outputs; ``plain`` is an ordinary run.  GC is off while
    timing, so a collection does not land in some step at random.
    """
    check_counts(repeat, warmup)
    slots = np.zeros(max(steps, 1), dtype=np.float64)
    samples = np.zeros((repeat, steps), dtype=np.float64)
    call_samples = np.zeros(repeat, dtype=np.float64)
    outputs: dict[str, np.ndarray] = {}
    for _ in range(warmup):
        plain()
        outputs = profiled(slots)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for round_index in range(repeat):
            start = time.perf_counter()
            plain()
            call_samples[round_index] = time.perf_counter() - start
            slots[:] = 0.0
            outputs = profiled(slots)
            samples[round_index] = slots[:steps]
    finally:
        if gc_was_enabled:
            gc.enable()
    return StepTimes(samples, call_samples, outputs, warmup)
