"""Case identities and session plans: what ``model/dims/17`` means and which cases a session
of N cases runs.

A case id names its category, its kind and a number, and nothing else is needed to rebuild
the case: the number picks the seed model (or base artifact) round-robin and seeds the
random choices of the mutation.  So a failure seen in CI is reproduced anywhere with
``tools/fuzz.py --case <id>``, and the session seed only decides which numbers run
(seed S runs numbers from S * 1,000,000 up).
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from fuzz.feeds import LAYOUT_TRANSFORMS, SIGNATURE_TRANSFORMS
from fuzz.generate import CLI_KINDS, GENERATED_MODEL_KINDS, SAVE_KINDS, CliCase, SaveCase
from fuzz.generate.base import NUMBERS_PER_SEED
from fuzz.mutate import MODEL_KINDS, Mutant, NotApplicable
from fuzz.seeds import BUILDERS, seed
from fuzz.tamper import ARTIFACT_KINDS, ArtifactContext
from fuzz.tamper import NotApplicable as TamperNotApplicable

MODEL = "model"
ARTIFACT = "artifact"
CLI = "cli"
SAVE = "save"
CATEGORIES = {MODEL: {**MODEL_KINDS, **GENERATED_MODEL_KINDS}, ARTIFACT: ARTIFACT_KINDS,
              CLI: CLI_KINDS, SAVE: SAVE_KINDS}
# The seed models that are compiled into the base artifacts of every session: one fully
# compiled, one with a fallback (host) node, which brings host_nodes.json into play.
ARTIFACT_SEEDS = ("mlp", "branch")
# The artifact kind that leaves the artifact intact and changes the run-time inputs instead.
ARTIFACT_INPUTS = "inputs"

# Relative share of a session's cases per kind, within its category.  Controls (the
# unmutated seeds, the intact artifacts) get one case per seed model or base artifact
# instead.  The generated model kinds are few but dear (a deep graph compiles for seconds
# the first time, a bomb that hangs costs its deadline): 800 cases give each about five.
MODEL_SHARES = {"dims": 3, "dtype": 3, "attr": 5, "edge": 5, "name": 4, "opset": 2,
                "init": 4, "const": 3, "structure": 3, "bytes": 3, "inputs": 2, "mixed": 4,
                "external": 2, "deep": 0.5, "wide": 0.5, "nest": 0.5, "bomb": 0.5}
ARTIFACT_SHARES = {"manifest-key": 3, "manifest-type": 3, "manifest-number": 4,
                   "manifest-string": 3, "manifest-list": 2, "manifest-document": 2,
                   "truncate": 2, "flip": 2, "replace": 3, "extra-file": 2, "host-nodes": 2,
                   "weights-header": 3, "inputs": 2}
SHARES = {MODEL: MODEL_SHARES, ARTIFACT: ARTIFACT_SHARES, CLI: {"escapes": 1},
          SAVE: {"target": 1}}
CONTROLS = {(MODEL, "seed"): len(BUILDERS), (ARTIFACT, "intact"): len(ARTIFACT_SEEDS)}
# Share of a session's cases per category (renormalized over the categories selected).
CATEGORY_FRACTIONS = {MODEL: 0.54, ARTIFACT: 0.43, CLI: 0.015, SAVE: 0.015}


@dataclass(frozen=True, order=True)
class CaseId:
    category: str
    kind: str
    number: int

    def __str__(self) -> str:
        return f"{self.category}/{self.kind}/{self.number}"

    @classmethod
    def parse(cls, text: str) -> CaseId:
        parts = text.strip().split("/")
        if len(parts) != 3 or not parts[2].lstrip("-").isdigit():
            raise ValueError(f"a case id looks like model/dims/17, not {text!r}")
        category, kind, number = parts[0], parts[1], int(parts[2])
        if kind not in CATEGORIES.get(category, {}):
            raise ValueError(f"unknown case kind {category}/{kind}; known: "
                             f"{', '.join(all_kinds())}")
        return cls(category, kind, number)


def all_kinds() -> list[str]:
    return [f"{category}/{kind}" for category, kinds in CATEGORIES.items() for kind in kinds]


def select_kinds(patterns: list[str] | None) -> list[tuple[str, str]]:
    """Kinds matching any of ``patterns`` ("model", "dims", "artifact/flip"); all if None."""
    kinds = [(category, kind) for category, table in CATEGORIES.items() for kind in table]
    if not patterns:
        return kinds
    chosen = [(c, k) for c, k in kinds
              if any(p in (c, k, f"{c}/{k}") for p in patterns)]
    if not chosen:
        raise ValueError(f"no kind matches {patterns}; known: {', '.join(all_kinds())}")
    return chosen


def plan(total: int, session_seed: int = 0, patterns: list[str] | None = None) -> list[CaseId]:
    """About ``total`` cases over the selected kinds: the controls, then the rest split by
    category (CATEGORY_FRACTIONS) and by share within it (largest remainders)."""
    kinds = select_kinds(patterns)
    counts = {kind: min(CONTROLS[kind], total) for kind in kinds if kind in CONTROLS}
    remaining = max(total - sum(counts.values()), 0)
    shares = {(c, k): SHARES[c][k] for c, k in kinds if (c, k) not in CONTROLS}
    categories = {c for c, _ in shares}
    per_category = _split(remaining, {(c, ""): CATEGORY_FRACTIONS[c] for c in categories})
    for category in categories:
        own = {kind: share for kind, share in shares.items() if kind[0] == category}
        counts.update(_split(per_category[(category, "")], own))
    start = session_seed * NUMBERS_PER_SEED
    return [CaseId(category, kind, start + i)
            for (category, kind), count in sorted(counts.items()) for i in range(count)]


def _split(total: int, shares: dict[tuple[str, str], float]) -> dict[tuple[str, str], int]:
    weight = sum(shares.values())
    exact = {kind: total * share / weight for kind, share in shares.items()}
    counts = {kind: int(value) for kind, value in exact.items()}
    by_remainder = sorted(exact, key=lambda k: (counts[k] - exact[k], k))
    for kind in by_remainder[: total - sum(counts.values())]:
        counts[kind] += 1
    return counts


# ---------------------------------------------------------------------------- model cases


@dataclass
class ModelCase:
    case: CaseId
    seed_name: str
    mutant: Mutant
    seed_feeds: dict[str, np.ndarray]

    def request(self) -> dict:
        m = self.mutant
        return {"type": MODEL, "case": str(self.case), "data": m.data,
                "as_file": m.as_file, "files": m.files,
                "seed_feeds": self.seed_feeds, "overrides": m.feed_overrides,
                "feed_transform": m.feed_transform, "layout": m.layout, "source": m.source,
                "model_path": m.model_path, "base_dir": m.base_dir, "cwd": m.cwd,
                "byte_patches": m.byte_patches, "oracle_data": m.oracle_data,
                "expected": m.expected, "oracle": m.oracle, "sentinel": m.sentinel}


def build_model_case(case: CaseId) -> ModelCase:
    """The mutant of ``case``: seed models are tried round-robin from ``number`` until the
    mutation applies to one (e.g. ``const`` needs index constants)."""
    rng = random.Random(str(case))
    if case.kind in GENERATED_MODEL_KINDS:
        mutant = GENERATED_MODEL_KINDS[case.kind](rng, case.number)
        return ModelCase(case, "generated", mutant, {})
    names = list(BUILDERS)
    reasons = []
    for offset in range(len(names)):
        name = names[(case.number + offset) % len(names)]
        model = onnx.ModelProto()
        model.CopyFrom(seed(name).model)
        try:
            mutant = MODEL_KINDS[case.kind](model, rng)
        except NotApplicable as why:
            reasons.append(f"{name}: {why}")
            continue
        return ModelCase(case, name, mutant, seed(name).feeds)
    raise NotApplicable(f"{case}: applies to no seed model ({'; '.join(reasons)})")


# ---------------------------------------------------------------------------- artifact cases


@dataclass
class ArtifactCase:
    case: CaseId
    base_name: str
    directory: Path
    description: str
    feed_transform: str = ""


def build_artifact_case(case: CaseId, context: ArtifactContext, root: Path) -> ArtifactCase:
    """Copy a base artifact to ``root`` and tamper with the copy (base artifacts are tried
    round-robin from ``number`` until the tamper applies)."""
    names = sorted(context.bases)
    reasons = []
    for offset in range(len(names)):
        name = names[(case.number + offset) % len(names)]
        rng = random.Random(f"{case}/{name}")
        directory = root / f"{case.kind}-{case.number}-{name}"
        remove_tree(directory)
        shutil.copytree(context.bases[name], directory, symlinks=True)
        if case.kind == ARTIFACT_INPUTS:
            # Layout changes must give identical outputs, wrong signatures an error; odd
            # values have no expected outputs here (the model cases cover them).
            transform = rng.choice([*LAYOUT_TRANSFORMS, *SIGNATURE_TRANSFORMS])
            return ArtifactCase(case, name, directory, f"{transform}: first input {transform}",
                                transform)
        try:
            description = ARTIFACT_KINDS[case.kind](directory, context, name, rng)
        except TamperNotApplicable as why:
            reasons.append(f"{name}: {why}")
            remove_tree(directory)
            continue
        return ArtifactCase(case, name, directory, description)
    raise NotApplicable(f"{case}: applies to no base artifact ({'; '.join(reasons)})")


def remove_tree(path: Path) -> None:
    """Remove a tampered artifact, whatever it became (symlinks are not followed, FIFOs are
    unlinked, directories that replaced files are removed)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------- cli and save


def build_cli_case(case: CaseId) -> CliCase:
    """The hostile model and command lines of a ``cli`` case."""
    return CLI_KINDS[case.kind](random.Random(str(case)), case.number)


def build_save_case(case: CaseId) -> SaveCase:
    """The model and the target laid out for a ``save`` case."""
    return SAVE_KINDS[case.kind](random.Random(str(case)), case.number)
