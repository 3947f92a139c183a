"""Generated case families: models, command lines and save targets built from scratch by a
random generator seeded with the case id, rather than one mutation of a seed model.

``GENERATED_MODEL_KINDS`` are model cases (compiled, run and judged like the mutants);
``CLI_KINDS`` and ``SAVE_KINDS`` are the categories ``cli`` and ``save``, which the worker
runs differently (``fuzz.worker_cli``, ``fuzz.worker_save``).
"""

from __future__ import annotations

from typing import Callable

from fuzz.generate.base import Generator, size_tier
from fuzz.generate.bombs import bomb
from fuzz.generate.external import external
from fuzz.generate.graphs import chain, fan
from fuzz.generate.nesting import nest
from fuzz.generate.save_targets import SaveCase, save_case
from fuzz.generate.terminal import CliCase, escapes_case

GENERATED_MODEL_KINDS: dict[str, Generator] = {
    "external": external,
    "deep": chain,
    "wide": fan,
    "nest": nest,
    "bomb": bomb,
}
CLI_KINDS: dict[str, Callable[..., CliCase]] = {"escapes": escapes_case}
SAVE_KINDS: dict[str, Callable[..., SaveCase]] = {"target": save_case}

__all__ = ["CLI_KINDS", "GENERATED_MODEL_KINDS", "SAVE_KINDS", "CliCase", "SaveCase",
           "size_tier"]
