"""Configs for schedule tests: sampled from a kernel's own search space.

A kernel's knobs depend on earlier choices (a product that keeps its loops has no blocking
knobs), so a config is sampled to a fixed point: schedule, pick a value for every knob met
that the config does not name yet, drop the knobs no longer met, repeat.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ember.core.target import Target
from ember.ir.loop.stmt import PrimFunc
from ember.schedule.config import ScheduleConfigError, Decisions, KernelConfig, Knob
from ember.schedule.default import default_schedule
from ember.schedule.pipeline import config_space

Space = Callable[[PrimFunc, Target, KernelConfig], list[Knob]]


def nest_space(func: PrimFunc, target: Target, config: KernelConfig) -> list[Knob]:
    """The knobs of the nest schedule alone (``default_schedule``)."""
    decisions = Decisions(config, kernel=func.name)
    default_schedule(func, target, decisions)
    return decisions.space


def kernel_space(func: PrimFunc, target: Target, config: KernelConfig,
                 constant_params: frozenset[int] = frozenset()) -> list[Knob]:
    """The knobs of every loop stage (``config_space``)."""
    return list(config_space(func, target, config, constant_params=constant_params))


def sampled_config(func: PrimFunc, target: Target, pick: Callable[[Knob], object],
                   space: Space = nest_space) -> KernelConfig:
    values: dict[str, object] = {}
    for _ in range(16):
        try:
            knobs = space(func, target, KernelConfig.of(values))
        except ScheduleConfigError as error:  # an earlier choice changed what a later knob allows
            values.pop(error.knob)
            continue
        met = {knob.name for knob in knobs}
        new = {knob.name: pick(knob) for knob in knobs
               if knob.name not in values or values[knob.name] not in knob.choices}
        values = {name: value for name, value in {**values, **new}.items() if name in met}
        if not new:
            return KernelConfig.of(values)
    raise AssertionError(f"the knobs of {func.name} did not settle: {values}")


def random_config(func: PrimFunc, target: Target, seed: int,
                  space: Space = nest_space) -> KernelConfig:
    """Every knob at a random legal value."""
    rng = np.random.default_rng(seed)
    return sampled_config(func, target,
                          lambda knob: knob.choices[rng.integers(len(knob.choices))], space)


def kernel_arrays(impl, graph, scheduled, rng: np.random.Generator
                  ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The arrays a compiled kernel ``impl`` of ``graph`` reads -- its constants, random
    floats for the rest -- as its lowered form takes them and as ``scheduled`` (its
    ``schedule_kernel`` result) takes them, constant operands packed as the build packs
    them."""
    arrays = [graph.constants[name] if name in graph.constants else
              rng.standard_normal(graph.types[name].shape).astype(np.float32)
              for name in impl.group.inputs]
    packed = list(arrays)
    for prepack in scheduled.prepacks:
        packed[prepack.param] = prepack.apply(arrays[prepack.param])
    return arrays, packed
