"""Run-time inputs that do not fit (``inputs``): the unmutated seed, called with its first
input in an odd layout (Fortran order, strided, read-only, misaligned), with a signature the
model does not have (dtype, shape, a list, None, missing or extra inputs), or with odd values
(NaN, infinities, denormals).

The model is valid; what is tested is the boundary between numpy and the compiled code, where
a wrong assumption about strides or alignment reads the wrong memory.
"""

from __future__ import annotations

import random

import onnx

from fuzz.feeds import LAYOUT_TRANSFORMS, SIGNATURE_TRANSFORMS, VALUE_TRANSFORMS
from fuzz.mutate.base import Mutant, pick


def mutate_inputs(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    transform = pick(rng, [*LAYOUT_TRANSFORMS, *SIGNATURE_TRANSFORMS, *VALUE_TRANSFORMS])
    return Mutant(model.SerializeToString(), f"{transform}: first input {transform}",
                  feed_transform=transform)
