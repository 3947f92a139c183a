"""What a model mutation produces, and the small helpers every mutator uses.

A mutator works on a private copy of a seed's ModelProto and returns a human-readable
description of exactly what it changed; the description ends up in the failure list, so it
must say enough to understand the case without re-running it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

import numpy as np
import onnx

T = TypeVar("T")


class NotApplicable(Exception):
    """The mutation has nothing to act on in this model (the case generator tries another
    seed model)."""


@dataclass
class Mutant:
    """A mutated model as ember and the oracle receive it.

    ``data`` is the serialized model (possibly not even a valid protobuf); ``feed_overrides``
    replaces some run-time inputs (e.g. out-of-range indices); ``as_file`` makes the worker
    write the model (and ``files`` beside it) to a directory and pass its path instead of
    bytes, so that external-data references are resolved; ``feed_transform`` names a change
    of the run-time inputs (``fuzz.feeds.transform_feeds``) made in the worker.

    The generated families (``fuzz.generate``) need more, all optional:

    * file system: ``layout`` (entries made in the case's scratch directory, see
      ``fuzz.layout``), ``source`` (how ember gets the model: ``bytes``, ``proto`` or
      ``path`` -- then written to ``model_path``), ``base_dir`` and ``cwd`` (relative to the
      scratch directory, ``None``: not given / unchanged), ``byte_patches`` (equal-length
      replacements in the serialized model, for text protobuf cannot hold);
    * what is correct: ``oracle_data`` (the model the oracle runs, when ember's differs only
      in how it is stored, e.g. the legitimate load of external data), ``expected`` (outputs
      known analytically, for models no oracle runs in time; then ``oracle="expected"``),
      ``must_succeed`` (the model is valid and within what ember should handle: an
      EmberError is a failure too), ``sentinel`` (bytes planted outside the allowed
      directory that must never appear in an output or a saved artifact);
    * ``budgets``: seconds per phase, replacing the session's defaults (a generated graph's
      compile deadline grows with its size).
    """

    data: bytes
    description: str
    feed_overrides: dict[str, np.ndarray] = field(default_factory=dict)
    as_file: bool = False
    files: dict[str, bytes] = field(default_factory=dict)
    feed_transform: str = ""
    layout: list = field(default_factory=list)  # list[fuzz.layout.Entry]
    source: str = ""
    model_path: str = "model/model.onnx"
    base_dir: str | None = None
    cwd: str | None = None
    byte_patches: list[tuple[bytes, bytes]] = field(default_factory=list)
    oracle_data: bytes | None = None
    expected: list[np.ndarray] | None = None
    oracle: str = "onnx"
    must_succeed: bool = False
    sentinel: bytes = b""
    budgets: dict[str, float] = field(default_factory=dict)


# A mutator (one per kind) turns a private copy of a seed model into a Mutant.
Mutator = Callable[[onnx.ModelProto, random.Random], "Mutant"]

# A sub-mutation edits the model in place and returns its description, or returns a whole
# Mutant when it needs more than a changed proto (raw bytes, feed overrides, a file).
SubMutation = Callable[[onnx.ModelProto, random.Random], "str | Mutant"]


def pick(rng: random.Random, items: Sequence[T], what: str = "site") -> T:
    """A uniform choice that says why when there is nothing to choose from."""
    if not items:
        raise NotApplicable(f"no {what} to mutate")
    return items[rng.randrange(len(items))]


def pick_named(rng: random.Random, catalog: dict[str, T]) -> tuple[str, T]:
    key = pick(rng, sorted(catalog))
    return key, catalog[key]


def short(text: str | bytes, limit: int = 60) -> str:
    """A printable, bounded rendering of a hostile string for descriptions."""
    shown = repr(text)
    return shown if len(shown) <= limit else f"{shown[:limit]}...({len(text)} chars)"


def apply_sub_mutations(model: onnx.ModelProto, rng: random.Random,
                        subs: dict[str, SubMutation]) -> Mutant:
    """Try the named sub-mutations in a random order until one applies to ``model``."""
    names = sorted(subs)
    rng.shuffle(names)
    reasons = []
    for name in names:
        trial = onnx.ModelProto()
        trial.CopyFrom(model)
        try:
            result = subs[name](trial, rng)
        except NotApplicable as why:
            reasons.append(f"{name}: {why}")
            continue
        if isinstance(result, Mutant):
            result.description = f"{name}: {result.description}"
            return result
        return Mutant(trial.SerializeToString(), f"{name}: {result}")
    raise NotApplicable("; ".join(reasons))
