"""Several mutations stacked on one model (``mixed``).

Each single mutation is usually caught by the first check it meets; two or three at once reach
states no single one does (a renamed value whose type also changed, an out-of-range attribute
on a node that also lost an input), where checks that assume the rest is sane give way.
"""

from __future__ import annotations

import random
import onnx

from fuzz.mutate.base import Mutant, Mutator, NotApplicable, pick


def mixed(kinds: dict[str, Mutator]) -> Mutator:
    """A mutator applying 2 or 3 of ``kinds`` in a row (a step that makes the model
    unparseable ends the chain)."""

    def mutate(model: onnx.ModelProto, rng: random.Random) -> Mutant:
        steps = rng.choice([2, 2, 3])
        current = model
        applied: list[Mutant] = []
        for _ in range(steps * 3):
            if len(applied) == steps:
                break
            kind = pick(rng, sorted(kinds))
            trial = onnx.ModelProto()
            trial.CopyFrom(current)
            try:
                mutant = kinds[kind](trial, rng)
            except NotApplicable:
                continue
            except Exception:
                if not applied:
                    raise  # a mutator failing on a seed is a harness bug: report it
                continue  # on an already damaged model (bytes for names...) it may not apply
            mutant.description = f"{kind}/{mutant.description}"
            applied.append(mutant)
            try:
                current = onnx.load_model_from_string(mutant.data)
            except Exception:  # not a protobuf any more: nothing further to stack on
                break
        if not applied:
            raise NotApplicable("no mutation applied")
        last = applied[-1]
        return Mutant(last.data, " + ".join(m.description for m in applied),
                      feed_overrides={k: v for m in applied for k, v in m.feed_overrides.items()},
                      as_file=any(m.as_file for m in applied),
                      files={k: v for m in applied for k, v in m.files.items()},
                      feed_transform=last.feed_transform)

    return mutate
