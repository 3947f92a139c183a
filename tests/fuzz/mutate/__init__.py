"""Structural mutations of ONNX models, one module per family; ``MODEL_KINDS`` maps each
kind (the category of the outcome table) to its mutator."""

from __future__ import annotations

import random

import onnx

from fuzz.mutate.attributes import mutate_attributes
from fuzz.mutate.base import Mutant, Mutator, NotApplicable
from fuzz.mutate.edges import mutate_edges
from fuzz.mutate.inputs import mutate_inputs
from fuzz.mutate.mixed import mixed
from fuzz.mutate.names import mutate_names
from fuzz.mutate.opsets import mutate_opsets
from fuzz.mutate.raw_bytes import mutate_bytes
from fuzz.mutate.structure import mutate_structure
from fuzz.mutate.tensors import mutate_constants, mutate_initializers
from fuzz.mutate.types import mutate_dims, mutate_dtype

def unmutated(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    """The control: the seed itself must compile and match the oracle."""
    return Mutant(model.SerializeToString(), "unmutated seed")


# The structural kinds, which ``mixed`` stacks (bytes-level damage rarely leaves a model to
# stack on; input transforms apply to valid models only).
STRUCTURAL_KINDS: dict[str, Mutator] = {
    "dims": mutate_dims,
    "dtype": mutate_dtype,
    "attr": mutate_attributes,
    "edge": mutate_edges,
    "name": mutate_names,
    "opset": mutate_opsets,
    "init": mutate_initializers,
    "const": mutate_constants,
    "structure": mutate_structure,
}

MODEL_KINDS: dict[str, Mutator] = {
    "seed": unmutated,
    **STRUCTURAL_KINDS,
    "bytes": mutate_bytes,
    "inputs": mutate_inputs,
    "mixed": mixed(STRUCTURAL_KINDS),
}

__all__ = ["MODEL_KINDS", "Mutant", "Mutator", "NotApplicable"]
