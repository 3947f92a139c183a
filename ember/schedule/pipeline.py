"""The loop-level pipeline: from a lowered kernel to a scheduled one, stage by stage.

The graph level has ``passes/pipeline.py``; this is its loop-level counterpart.  A lowered
kernel (one fused group as a PrimFunc, ``ember.lower``) goes through :data:`LOOP_STAGES` in
order, each a step of one :class:`~ember.schedule.primitives.Schedule`:

1. ``gemm_template``     matrix products onto the blocked GEMM template (opt level >= 1)
2. ``fuse_row_nests``    consecutive nests over the same rows as one loop over the rows
3. ``schedule_nests``    parallel, vectorized and register-tiled loop nests
4. ``rfactor_reductions`` row reductions into vectors of partial accumulators
5. ``simplify_indices``  divisions of indices and of compared positions that loop bounds
   make exact removed
6. ``partition_guarded_loops`` border tests of padded windows, and the piece tests of a
   concatenation, out of the inner loops
7. ``hoist_invariant_loads`` loads a vectorized loop does not move read once before it
8. ``hoist_invariant_divisions`` the remaining divisions computed before their loops

Every decision a stage takes is a knob of the kernel's config (:mod:`ember.schedule.config`):
:func:`schedule_kernel` applies a config -- the default heuristic's choices where it is
silent -- and returns the scheduled kernel, the replayable trace of the steps it applied,
the complete config and the kernel's search space.  :func:`propose_config` is the default
heuristic as a config.  The runner can verify the IR after every stage (the loop verifier),
times each stage and, on request, keeps the printed IR after each one (``ember inspect
--stages --kernel K`` shows it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

from ember.core.dtypes import DType
from ember.core.errors import VerificationError
from ember.core.target import Target
from ember.core.traced import plain, size_class
from ember.ir.loop.printer import format_func
from ember.ir.loop.stmt import Gemm, GemmKnobs, PrimFunc
from ember.ir.loop.verifier import verify_func
from ember.schedule.config import Decisions, KernelConfig, Knob
from ember.schedule.default import default_schedule
from ember.schedule.gemm import (GemmChooser, GemmShape, Prepack, default_parallel,
                                 fold_columns_limit, fold_pays, gathered_a_knobs,
                                 gathered_a_tiles, panels_in_place_legal, reads_a_in_place,
                                 template_pays, tile_choices, vector_rows_knobs,
                                 vector_rows_pay, vector_rows_tiles)
from ember.schedule.primitives import Schedule, Trace
from ember.schedule.row_fusion import fuse_row_nests


@dataclass(frozen=True)
class StageContext:
    target: Target
    decisions: Decisions
    opt_level: int


@dataclass(frozen=True)
class LoopStage:
    """One stage: its name, what it does to the schedule, and from which opt level it runs."""

    name: str
    apply: Callable[[Schedule, StageContext], None]
    doc: str
    min_opt_level: int = 0


@dataclass(frozen=True)
class StageRecord:
    """What one stage did to one kernel: whether it changed the IR, how long it took, and
    (when asked for) the IR after it."""

    name: str
    changed: bool
    seconds: float
    ir: str | None = None


@dataclass
class ScheduledKernel:
    """The result of :func:`schedule_kernel`."""

    func: PrimFunc
    trace: Trace
    config: KernelConfig            # every knob with the value applied
    space: tuple[Knob, ...]         # the kernel's knobs, their defaults and legal values
    prepacks: tuple[Prepack, ...]   # constant operands to pack (see schedule/gemm.py)
    stages: tuple[StageRecord, ...] = field(default_factory=tuple)


# ---------------------------------------------------------------------- the stages


def _gemm_template(schedule: Schedule, context: StageContext) -> None:
    schedule.gemm_template(chooser=_ConfigGemmChooser(context.target, context.decisions))


def _fuse_row_nests(schedule: Schedule, context: StageContext) -> None:
    fuse_row_nests(schedule, context.decisions)


def _schedule_nests(schedule: Schedule, context: StageContext) -> None:
    default_schedule(schedule.func, context.target, context.decisions, schedule)


def _rfactor_reductions(schedule: Schedule, context: StageContext) -> None:
    def choose(index: int, proposed: int, legal: list[int]) -> int:
        return context.decisions.choose(
            f"reduction{index}.partials", proposed, [0, *legal],
            "partial accumulators of a row reduction, a multiple of the vector width "
            "(0: it stays scalar)")

    schedule.rfactor_reductions(choose=choose)


def _partition_guarded_loops(schedule: Schedule, context: StageContext) -> None:
    if context.decisions.choose("partition", True, [False, True],
                                "split guarded loops around the range where their border "
                                "tests are decided"):
        schedule.partition_guarded_loops()


def _simplify_indices(schedule: Schedule, context: StageContext) -> None:
    schedule.simplify_indices()


def _hoist_invariant_loads(schedule: Schedule, context: StageContext) -> None:
    schedule.hoist_invariant_loads()


def _hoist_invariant_divisions(schedule: Schedule, context: StageContext) -> None:
    schedule.hoist_invariant_divisions()


LOOP_STAGES: tuple[LoopStage, ...] = (
    LoopStage("gemm_template", _gemm_template,
              "matrix-product nests onto the blocked, packed GEMM template", min_opt_level=1),
    LoopStage("fuse_row_nests", _fuse_row_nests,
              "consecutive nests over the same rows as one loop over the rows"),
    LoopStage("schedule_nests", _schedule_nests,
              "parallel, vectorized and register-tiled loop nests"),
    LoopStage("rfactor_reductions", _rfactor_reductions,
              "row reductions accumulated in vectors of partials"),
    LoopStage("simplify_indices", _simplify_indices,
              "divisions of indices and positions that loop bounds make exact removed"),
    LoopStage("partition_guarded_loops", _partition_guarded_loops,
              "border tests of padded windows and piece tests of concatenations out of "
              "the inner loops"),
    LoopStage("hoist_invariant_loads", _hoist_invariant_loads,
              "loads a vectorized loop does not move read once before it"),
    LoopStage("hoist_invariant_divisions", _hoist_invariant_divisions,
              "integer divisions computed before the loops they do not depend on"),
)


# ---------------------------------------------------------------------- the runner


def schedule_kernel(func: PrimFunc, target: Target, config: KernelConfig | None = None, *,
                    constant_params: frozenset[int] = frozenset(), opt_level: int = 2,
                    verify: bool = False, keep_ir: bool = False, strict: bool = True,
                    stages: tuple[LoopStage, ...] = LOOP_STAGES) -> ScheduledKernel:
    """Schedule the lowered kernel ``func`` for ``target`` with ``config`` (None: the
    default heuristic throughout).  ``constant_params`` are the parameters that receive
    compile-time constants; ``verify`` checks the loop IR after every stage, ``keep_ir``
    keeps its printed form in the stage records (and the kernel as lowered, as a first
    record named ``lower``).  ``strict=False`` ignores config knobs the kernel does not ask
    (a search mutating a config may switch off the part that had them).  A config knob the kernel does not have, or
    a value its knob does not allow, is a :class:`~ember.schedule.config.ConfigError`."""
    decisions = Decisions(config or KernelConfig(), kernel=func.name)
    context = StageContext(target, decisions, opt_level)
    schedule = Schedule(func, target, constant_params)
    records = [StageRecord("lower", False, 0.0, format_func(func))] if keep_ir else []
    for stage in stages:
        if opt_level < stage.min_opt_level:
            continue
        before = schedule.func
        started = time.perf_counter()
        stage.apply(schedule, context)
        seconds = time.perf_counter() - started
        if verify:
            try:
                verify_func(schedule.func)
            except VerificationError as error:
                raise VerificationError(f"after loop stage '{stage.name}': {error}") from None
        records.append(StageRecord(stage.name, schedule.func is not before, seconds,
                                   format_func(schedule.func) if keep_ir else None))
    if strict:
        decisions.check_all_used()
    return ScheduledKernel(schedule.func, schedule.trace, decisions.applied_config,
                           tuple(decisions.space), tuple(schedule.prepacks), tuple(records))


def propose_config(func: PrimFunc, target: Target, *,
                   constant_params: frozenset[int] = frozenset(),
                   opt_level: int = 2) -> KernelConfig:
    """The default heuristic's complete config for ``func`` (every knob named)."""
    return schedule_kernel(func, target, None, constant_params=constant_params,
                           opt_level=opt_level).config


def config_space(func: PrimFunc, target: Target, config: KernelConfig | None = None, *,
                 constant_params: frozenset[int] = frozenset(),
                 opt_level: int = 2) -> tuple[Knob, ...]:
    """The knobs of ``func`` as met when scheduling with ``config``: they depend on the values
    of earlier knobs (a product that keeps its loops has no blocking knobs), so a search
    asks again after each change, and knobs of ``config`` that no longer apply are
    ignored rather than refused."""
    return schedule_kernel(func, target, config, constant_params=constant_params,
                           opt_level=opt_level, strict=False).space


# ---------------------------------------------------------------------- GEMM knobs


class _ConfigGemmChooser(GemmChooser):
    """The GEMM template's decisions as knobs ``gemm<i>.*`` of the kernel config."""

    def __init__(self, target: Target, decisions: Decisions):
        super().__init__(target)
        self.decisions = decisions

    def knobs(self, index: int, shape: GemmShape) -> GemmKnobs | None:
        ask, name = self.decisions.choose, f"gemm{index}"
        fold_default = fold_pays(shape, self.target)
        if not ask(f"{name}.template", fold_default or template_pays(shape, self.target),
                   [False, True],
                   "run the product on the blocked GEMM template (else its plain loops)"):
            return None
        if reads_a_in_place(shape, self.target):
            return self._gathered_a_knobs(name, shape)
        fold = shape.foldable and ask(
            f"{name}.fold_batch", fold_default, [False, True],
            "fold the batch into the columns: one product, A streamed once for the batch")
        if fold:
            shape = shape.folded()
        turned = not fold and shape.a_prepacked and ask(
            f"{name}.vector_rows", vector_rows_pay(shape, self.target), [False, True],
            "turn the register tile around: rows along the vectors, columns broadcast "
            "(a product with few columns)")
        if turned:
            default = vector_rows_knobs(shape, self.target)
            mr, nr = ask(f"{name}.tile", (default.mr, default.nr),
                         vector_rows_tiles(self.target),
                         "register tile of the micro-kernel: rows (vectors) x columns")
            proposed = vector_rows_knobs(shape, self.target, tile=(mr, nr))
        else:
            default = shape.default_knobs(self.target)
            mr, nr = ask(f"{name}.tile", (default.mr, default.nr), tile_choices(self.target),
                         "register tile of the micro-kernel: rows x columns")
            proposed = shape.default_knobs(self.target, tile=(mr, nr))
        # (a traced n is planned for by its class, as default_knobs plans it: a task as wide
        # as the sample's columns made sizes of one class differ in their code)
        planned = -(-size_class(shape.n) // nr) * nr
        kc, mc, nc = self._task_blocking(
            name, shape, mr, nr, proposed,
            lambda mc: fold_columns_limit(mc, nr) if fold or shape.out_runs or turned
            else planned)
        # (turned around, A is read in its compile-time strips: no copy to decide)
        pack_a = turned or ask(f"{name}.pack_a", proposed.pack_a, [False, True],
                               "each task copies its block of A into row strips first")
        in_place = not fold and not turned and shape.b_rows_contiguous and ask(
            f"{name}.b_in_place", proposed.b_in_place, [False, True],
            "read B's full panels where B is (its rows are contiguous) instead of packing")
        return GemmKnobs(mr, nr, kc, mc, nc, self.target.lanes_for(DType.FLOAT32), pack_a,
                         fold_batch=fold, b_in_place=in_place, vector_rows=turned)

    def _gathered_a_knobs(self, name: str, shape: GemmShape) -> GemmKnobs:
        """The knobs of a product whose A is read in place through a table of offsets (a
        blocked convolution): its tile and blocking; nothing is copied, nothing folded."""
        ask = self.decisions.choose
        default = gathered_a_knobs(shape, self.target)
        mr, nr = ask(f"{name}.tile", (default.mr, default.nr),
                     gathered_a_tiles(self.target, shape.n),
                     "register tile of the micro-kernel: rows (broadcasts of A) x columns")
        proposed = gathered_a_knobs(shape, self.target, tile=(mr, nr))
        columns = -(-plain(shape.n) // nr) * nr
        kc, mc, nc = self._task_blocking(name, shape, mr, nr, proposed, lambda mc: columns)
        return GemmKnobs(mr, nr, kc, mc, nc, self.target.lanes_for(DType.FLOAT32),
                         pack_a=False, b_in_place=True)

    def _task_blocking(self, name: str, shape: GemmShape, mr: int, nr: int,
                       proposed: GemmKnobs, widest) -> tuple[int, int, int]:
        """The reduction block and a task's rows and columns (``kc``, ``mc``, ``nc``) for the
        tile ``mr x nr``; ``widest(mc)`` caps a task's columns (a scratch block's width)."""
        ask = self.decisions.choose
        # (choices from samples: a traced size is planned for by class, see default_knobs)
        m, n, k = plain(shape.m), plain(shape.n), plain(shape.k)
        kc = ask(f"{name}.kc", proposed.kc,
                 [c for c in (64, 128, 192, 256, 384, 512) if c < k] + [k],
                 "terms of the reduction per block (a kc x nr panel of B stays in L1)")
        rows = -(-m // mr) * mr
        mc = ask(f"{name}.mc", proposed.mc,
                 sorted({min(mr * f, rows) for f in (1, 2, 4, 8, 16, 32, 64)}),
                 "rows of a task (a multiple of the tile's rows)")
        columns, cap = -(-n // nr) * nr, widest(mc)
        nc = ask(f"{name}.nc", min(proposed.nc, cap),
                 sorted({min(nr * f, columns, cap) for f in (1, 2, 4, 8, 16, 32, 64)}),
                 "columns of a task (a multiple of the tile's columns)")
        return kc, mc, nc

    def finish(self, index: int, gemm: Gemm, pack_in_task_legal: bool) -> GemmKnobs:
        ask, name = self.decisions.choose, f"gemm{index}"
        in_task = ask(f"{name}.pack_in_task", pack_in_task_legal,
                      [False, *([True] if pack_in_task_legal else [])],
                      "each task packs its own panels of B right before using them")
        parallel = ask(f"{name}.parallel", default_parallel(gemm), [False, True],
                       "the product's tasks run on the thread pool")
        in_place = in_task and panels_in_place_legal(gemm) and ask(
            f"{name}.b_panels_in_place", True, [False, True],
            "panels that are one run of B's columns are read where they lie, not copied")
        return replace(gemm.knobs, pack_in_task=in_task, parallel=parallel,
                       b_panels_in_place=in_place)
