"""A kernel's schedule configs as a search space: canonical forms, random walks, mutation and
crossover.

A kernel's space is not a fixed product of knobs: which knobs exist and which values they
allow depends on earlier answers (a product that leaves the GEMM template has no tile; a
tile of 12 rows allows other task widths than one of 8).  So every candidate is made by
*asking the kernel*: :meth:`ConfigSpace.canonical` schedules the kernel with a config
(ignoring knobs it no longer asks for) and keeps the complete config it applied, with the
knobs it asked on the way -- the space around that config.  Scheduling takes milliseconds
and builds nothing, so the search explores by walking: change one knob to another of its
legal values, schedule, read the knobs of the result.  Configs the kernel refuses never reach
the C compiler.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from ember.core.errors import EmberError
from ember.core.target import Target
from ember.driver.single_kernel import KernelProblem, schedule_problem
from ember.schedule.config import KernelConfig, Knob
from ember.tune.features import kernel_features


@dataclass(frozen=True, eq=False)
class Point:
    """A canonical config, the knobs the kernel asked when scheduled with it, and the
    scheduled kernel's features (what the cost model reads)."""

    config: KernelConfig
    knobs: tuple[Knob, ...]
    features: np.ndarray

    @property
    def key(self) -> str:
        return self.config.to_json()


class ConfigSpace:
    """The configs of one kernel, explored by asking its schedule."""

    def __init__(self, problem: KernelProblem, target: Target):
        self.problem = problem
        self.target = target
        self._points: dict[str, Point | None] = {}
        self.default = self.canonical(None)
        if self.default is None:
            raise EmberError(f"kernel {problem.label} cannot be scheduled with its defaults")

    def canonical(self, config: KernelConfig | None) -> Point | None:
        """The complete config the kernel applies for ``config``, or None if it refuses it."""
        key = config.to_json() if config is not None else "<default>"
        if key not in self._points:
            try:
                scheduled = schedule_problem(self.problem, self.target, config)
            except EmberError:
                point = None
            else:
                point = Point(scheduled.config, tuple(scheduled.space),
                              kernel_features(scheduled.func, self.target, self.problem.flops))
            self._points[key] = point
            if point is not None:
                self._points.setdefault(point.key, point)
        return self._points[key]

    def mutate(self, point: Point, rng: random.Random, steps: int = 1) -> Point | None:
        """``point`` with ``steps`` knobs changed one after the other, each to another of the
        values it allows there."""
        for _ in range(steps):
            movable = [k for k in point.knobs if len(k.choices) > 1]
            if not movable:
                return None
            knob = rng.choice(movable)
            value = rng.choice([c for c in knob.choices if c != point.config.get(knob.name)])
            moved = self.canonical(point.config.with_values(**{knob.name: value}))
            if moved is None:
                return None
            point = moved
        return point

    def crossover(self, a: Point, b: Point, rng: random.Random) -> Point | None:
        """Each knob from ``a`` or ``b`` at random (knobs only one of them has come along)."""
        values = dict(a.config.as_dict())
        for name, value in b.config.as_dict().items():
            if name not in values or rng.random() < 0.5:
                values[name] = value
        return self.canonical(KernelConfig.of(values))

    def random_point(self, rng: random.Random) -> Point | None:
        """A random walk of a few steps from the default config."""
        return self.mutate(self.default, rng, steps=rng.randint(1, 4))
