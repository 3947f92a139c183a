"""``ember.compile(model, schedule="predicted")``: configs chosen by the cost model alone.

Nothing is measured.  For every kernel, the config space is walked from the default
(mutations of one to three knobs, ``CANDIDATES`` distinct configs the kernel accepts), the
shipped cost model (``ember.tune.cost_model``) predicts each one's speed relative to the
default, and the best is taken only where the model predicts at least ``MIN_PREDICTED_GAIN``
over the default -- a model's ranking is a guess, and the default is the heuristic's measured
choice, so a small predicted gain is not worth the risk.  The threshold was set by the models
themselves (the builds timed in turns in the tuner's runner, Zen 4): at 1.10 the shipped
model changed 20 of MobileNetV2's kernels and the model ran 5 % slower; at 1.5 it changes
1-3 kernels of each zoo model and the models run within 2 % of the default either way.
A kernel that two steps share is predicted once.  The proposals are walks with a fixed
seed: the same model compiles the same way every time.  Kernels of a build traced over
run-time sizes keep the default (their sizes must not be compared at compile time).
"""

from __future__ import annotations

import math
import random

import numpy as np

from ember.core.errors import EmberError
from ember.core.target import Target
from ember.core.traced import is_traced
from ember.ir.graph import FusedGroup, Graph
from ember.ir.loop.stmt import PrimFunc
from ember.schedule.config import KernelConfig
from ember.tune.cost_model import CostModel
from ember.tune.space import ConfigSpace

CANDIDATES = 16
MIN_PREDICTED_GAIN = 1.5


class PredictedSchedules:
    """A ``BuildOptions.config_chooser``: the cost model's pick per kernel (None: the
    default)."""

    def __init__(self, target: Target, opt_level: int = 2, model: CostModel | None = None,
                 seed: int = 0):
        self.model = model or CostModel.pretrained()
        if self.model is None:
            raise EmberError("schedule='predicted' needs the tuner's cost model: "
                             "pip install 'ember[tune]' (LightGBM)")
        self.target = target
        self.opt_level = opt_level
        self.seed = seed
        self.chosen: dict[str, KernelConfig | None] = {}

    def __call__(self, func: PrimFunc, constants: frozenset[int], flops: float,
                 workload_key: str) -> KernelConfig | None:
        if any(is_traced(d) for p in func.params for d in getattr(p, "shape", ())):
            # a build traced over run-time sizes: comparing its sizes in the features would
            # record guards and pin it to these sizes; the default heuristic it is
            return None
        if workload_key not in self.chosen:
            self.chosen[workload_key] = self._choose(func, constants, flops, workload_key)
        return self.chosen[workload_key]

    def _choose(self, func: PrimFunc, constants: frozenset[int], flops: float,
                workload_key: str) -> KernelConfig | None:
        from ember.driver.single_kernel import KernelProblem

        problem = KernelProblem(graph=Graph(name="predicted"), group=FusedGroup([], [], []),
                                lowered=func, workload_key=workload_key,
                                constant_params=constants, opt_level=self.opt_level,
                                flops=flops, label=func.name)
        space = ConfigSpace(problem, self.target)
        rng = random.Random(f"{self.seed}:{workload_key}")
        points = {}
        for _ in range(CANDIDATES * 4):
            if len(points) >= CANDIDATES:
                break
            point = space.mutate(space.default, rng, steps=rng.randint(1, 3))
            if point is not None and point.key != space.default.key:
                points.setdefault(point.key, point)
        if not points:
            return None
        candidates = list(points.values())
        scores = self.model.predict(np.stack([space.default.features] +
                                             [p.features for p in candidates]))
        best = int(np.argmax(scores[1:]))
        # the model's guess for the default is its own yardstick (ideally 0)
        if scores[1 + best] - scores[0] < math.log2(MIN_PREDICTED_GAIN):
            return None
        return candidates[best].config
