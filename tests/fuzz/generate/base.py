"""What the generated families share: size tiers, compile deadlines, model assembly.

A generated case draws every parameter (sizes, op mix, which path or target) from its own
random generator, seeded by the case id, so that sessions with other seeds meet new
combinations while an id still rebuilds its case exactly.  Sizes are drawn within a *tier*
that grows with the case's index in its session (``number % 1,000,000``): the first
:data:`TIER_SPAN` cases of a kind -- all that the 800-case CI run has -- stay cheap, and the
large sizes (thousands of nodes) come up only when a session runs more cases of the kind
(``EMBER_FUZZ_CASES=5000``, or ``tools/fuzz.py --kind deep --cases 200``).
"""

from __future__ import annotations

import random
from typing import Callable, Sequence, TypeVar

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fuzz.mutate.base import Mutant

T = TypeVar("T")
OPSET = 17
NUMBERS_PER_SEED = 1_000_000  # as fuzz.cases: a session's numbers start at seed * this
TIER_SPAN = 8
MAX_TIER = 3

# A generated case: its random generator and its case number -> the model and what to expect.
Generator = Callable[[random.Random, int], Mutant]


def size_tier(number: int) -> int:
    """0 for the first TIER_SPAN cases of a kind in a session, then 1, 2, up to MAX_TIER."""
    return min(MAX_TIER, (number % NUMBERS_PER_SEED) // TIER_SPAN)


def family(rng: random.Random, number: int, weights: dict[str, float]) -> str:
    """Which sub-family a case of a kind draws: the first cases of a session take each in
    turn (so that the CI run's handful covers them all), later ones draw by weight."""
    names = sorted(weights)
    index = number % NUMBERS_PER_SEED
    if index < len(names):
        return names[index]
    return rng.choices(names, [weights[n] for n in names])[0]


def draw_size(rng: random.Random, number: int, low: int, caps: Sequence[int]) -> int:
    """A size in [low, caps[tier]] (the tier of case ``number``), log-uniform, so that small
    sizes stay common in every tier (a bug that needs 40 nodes should not wait for a
    3,000-node case)."""
    high = max(low, caps[min(size_tier(number), len(caps) - 1)])
    if high <= low:
        return low
    return min(high, int(np.exp(rng.uniform(np.log(low), np.log(high + 1)))))


def compile_budget(nodes: int) -> float:
    """The compile deadline of a generated graph of ``nodes`` nodes: linear in its size, and
    never below the session's default.  ember's compile time is meant to be near-linear:
    about 5 ms a node from a warm cache, up to 50 ms cold on a busy 2-core machine (C
    compilation dominates); a case past this deadline is a *hang*."""
    return min(300.0, max(40.0, 20.0 + 0.08 * nodes))


def choose(rng: random.Random, weights: dict[str, float]) -> str:
    """A key of ``weights`` drawn in proportion to its weight."""
    keys = sorted(weights)
    return rng.choices(keys, [weights[k] for k in keys])[0]


def mix(rng: random.Random, names: Sequence[str]) -> dict[str, float]:
    """Random weights over ``names`` (some near zero): each case stresses another op mix."""
    return {name: rng.random() ** 2 + 0.02 for name in names}


def tensor(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def value(name: str, dtype: int = TensorProto.FLOAT,
          shape: Sequence[int | str] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, None if shape is None else list(shape))


def model(graph: onnx.GraphProto, functions: Sequence[onnx.FunctionProto] = (),
          extra_opsets: Sequence[tuple[str, int]] = (), check: bool = True) -> onnx.ModelProto:
    """A model of ``graph`` at opset 17, IR 8; checked with ``onnx.checker`` unless it is
    meant to be invalid (a generated family's valid models are the oracle's to judge)."""
    opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, v)
                                                 for d, v in extra_opsets]
    built = helper.make_model(graph, opset_imports=opsets, functions=list(functions),
                              producer_name="ember-fuzz")
    built.ir_version = 8
    if check:
        onnx.checker.check_model(built)
    return built


def feeds_for(rng_seed: int, shapes: dict[str, Sequence[int]]) -> dict[str, np.ndarray]:
    """Standard-normal float32 inputs (fixed by ``rng_seed``)."""
    generator = np.random.default_rng(rng_seed)
    return {name: generator.standard_normal(tuple(shape)).astype(np.float32)
            for name, shape in shapes.items()}
