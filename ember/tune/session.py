"""``ember.tune(model, ...)``: tune a model's kernels on this machine into a database.

The model is imported as ``ember.compile`` imports it (an ONNX file, bytes or ModelProto, a
``torch.nn.Module`` with example inputs, or an ember Graph), compiled once for the given
input shapes with the default schedules, and its kernels tuned (``ember.tune.tuner``).
``ember.compile(model, tuning_db=db)`` then builds it with the best configs found.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any, Mapping, Sequence

from ember.core.errors import InputError
from ember.core.target import Target
from ember.driver.pipeline import Build, BuildOptions, build_graph
from ember.frontend import import_model
from ember.ir.graph import Graph
from ember.ir.types import TensorType
from ember.schedule.config import KernelConfig
from ember.tune.database import TuningDatabase
from ember.tune.report import LiveProgress, parse_budget
from ember.tune.tuner import TuneResult, tune_build

DEFAULT_DB = "tune.db"


def tune(model: Any, example_inputs: Any = None, *,
         input_shapes: Mapping[str, Sequence[int]] | None = None,
         budget: str | float = "10m", db: str | Path | TuningDatabase = DEFAULT_DB,
         target: str | Target = "native", opt_level: int = 2, workers: int = 0,
         seed: int = 0, progress: bool = True, verify: bool = True,
         ray: str | None = None) -> TuneResult:
    """Tune ``model``'s kernels for ``budget`` (seconds, or ``"90s"``, ``"10m"``) of wall
    time, recording every measurement in the SQLite database ``db`` (created if new; a
    second run resumes from it and measures nothing twice).  ``input_shapes`` fixes
    the shapes of dynamic inputs (required when the model has any).  ``workers`` processes
    build candidates in parallel (default: one per CPU).  Returns per kernel the default and
    the tuned time; with ``verify`` the decisions are checked in the whole model (built
    both ways, timed in turns: a kernel not faster there keeps its default) and the model's
    two times come back too.  ``ember.compile(model, tuning_db=db)`` applies the result.

    ``ray`` tunes on every node of a Ray cluster instead (an address, ``"auto"``, or
    ``"local"`` for an instance started for the run): each node for its own machine (its
    native target; ``target`` is not used), all
    records in ``db`` (``ember.tune.distributed``); the result returned is this machine's
    node's where it is one of them, else the first node's."""
    seconds = parse_budget(budget)
    graph = import_model(model, example_inputs=example_inputs)
    shapes = _static_shapes(graph, input_shapes)
    resolved = target if isinstance(target, Target) else Target.parse(target)
    own = not isinstance(db, TuningDatabase)
    database = TuningDatabase(db) if own else db
    try:
        if ray is not None:
            from ember.tune.distributed import tune_on_ray
            from ember.tune.database import target_key

            nodes = tune_on_ray(graph, shapes, database, budget_seconds=seconds, address=ray,
                                opt_level=opt_level, workers=workers, seed=seed)
            here = target_key(Target.native())
            return next((n.result for n in nodes if n.target_key == here), nodes[0].result)

        build = build_graph(graph, shapes, BuildOptions(target=resolved, opt_level=opt_level))

        def rebuild(configs: dict[str, KernelConfig]) -> Build:
            return build_graph(graph, shapes, BuildOptions(target=resolved, opt_level=opt_level,
                                                           tuned_configs=configs))

        with LiveProgress() if progress else nullcontext() as display:
            return tune_build(build, database, budget_seconds=seconds, target=resolved,
                              opt_level=opt_level, workers=workers, seed=seed,
                              on_event=display, rebuild=rebuild if verify else None)
    finally:
        if own:
            database.close()


def _static_shapes(graph: Graph, given: Mapping[str, Sequence[int]] | None
                   ) -> dict[str, tuple[int, ...]]:
    """Every input's concrete shape: ``given``, else its static declared shape."""
    shapes = {name: tuple(int(d) for d in shape) for name, shape in (given or {}).items()}
    unknown = sorted(set(shapes) - set(graph.inputs))
    if unknown:
        raise InputError(f"input_shapes names {unknown}, which are not inputs of the model "
                         f"(its inputs: {', '.join(graph.inputs)})")
    for name in graph.inputs:
        vtype = graph.types.get(name)
        if name in shapes:
            continue
        if not isinstance(vtype, TensorType) or not vtype.is_static:
            raise InputError(f"input '{name}' has shape {vtype}; tuning needs concrete "
                             f"sizes: give input_shapes={{'{name}': (...)}} (or --shape / "
                             f"--batch on the command line)")
        shapes[name] = tuple(int(d) for d in vtype.shape)
    return shapes
