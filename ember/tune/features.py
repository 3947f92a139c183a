"""A scheduled kernel as a fixed-length vector of numbers: what the cost model reads.

The features describe the *scheduled* loop IR, the way Ansor's and TenSet's do, so that a
model trained on some kernels says something about others: how much work there is and how
it is split (FLOPs, bytes of every buffer, the extent of the parallel loops against the
threads), how it is vectorized and unrolled (vectorized and unrolled extents, innermost
extents), how the matrix products are blocked (the register tile, the reduction and task
blocks, and their footprints against the target's L1 and L2), and the config's own knobs
that have no trace in the IR.  Sizes enter as log2 (a model compares orders of magnitude);
every feature is defined for every kernel (0 where absent), in the order of
:data:`FEATURE_NAMES`.
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from ember.core.target import Target
from ember.ir.loop.expr import Const, Load
from ember.ir.loop.functor import children, walk
from ember.ir.loop.stmt import For, ForKind, Gemm, IfThenElse, PrimFunc, Seq, Stmt, Store

FEATURE_NAMES: tuple[str, ...] = (
    # the problem
    "log_flops", "log_param_bytes", "log_scratch_bytes", "params",
    # the loops
    "nests", "loops", "max_depth", "serial_loops", "parallel_loops", "vectorized_loops",
    "unrolled_loops", "log_parallel_extent", "parallel_tasks_per_thread",
    "log_vector_extent", "vector_lanes_ratio", "log_unrolled_extent", "log_inner_extent",
    "stores", "loads", "conditions", "vector_stores",
    # the matrix products
    "gemms", "gemm_log_m", "gemm_log_n", "gemm_log_k", "gemm_log_batch", "gemm_mr",
    "gemm_nr", "gemm_log_kc", "gemm_log_mc", "gemm_log_nc", "gemm_pack_a",
    "gemm_pack_in_task", "gemm_parallel", "gemm_fold_batch", "gemm_b_in_place",
    "gemm_b_panels_in_place", "gemm_vector_rows", "gemm_b_packed", "gemm_a_packed",
    "gemm_row_waste", "gemm_column_waste", "gemm_log_tasks", "gemm_tasks_per_thread",
    "gemm_panel_l1_ratio", "gemm_block_l2_ratio", "gemm_tile_accumulators",
    # the target
    "threads", "vector_bits", "log_l1", "log_l2",
)


def _log2(value: float) -> float:
    return math.log2(value) if value > 0 else 0.0


def kernel_features(func: PrimFunc, target: Target, flops: float) -> np.ndarray:
    """The feature vector of the scheduled kernel ``func`` on ``target``."""
    values = dict.fromkeys(FEATURE_NAMES, 0.0)
    values["log_flops"] = _log2(flops)
    scratch = int(func.attr("scratch", 0))
    sizes = [p.dtype.itemsize * math.prod(p.shape) for p in func.params
             if hasattr(p, "shape") and all(isinstance(d, int) for d in p.shape)]
    values["params"] = len(func.params)
    values["log_param_bytes"] = _log2(sum(sizes[:len(sizes) - scratch] or [0]))
    values["log_scratch_bytes"] = _log2(sum(sizes[len(sizes) - scratch:] or [0]))
    body = func.body
    nests = body.stmts if isinstance(body, Seq) else (body,)
    values["nests"] = len(nests)
    inner_extents: list[int] = []
    for loop, depth, innermost in _loops(body):
        extent = loop.extent.value if isinstance(loop.extent, Const) else 0
        values["loops"] += 1
        values["max_depth"] = max(values["max_depth"], depth)
        kind = loop.kind
        if kind is ForKind.PARALLEL:
            values["parallel_loops"] += 1
            values["log_parallel_extent"] = max(values["log_parallel_extent"], _log2(extent))
        elif kind is ForKind.VECTORIZED:
            values["vectorized_loops"] += 1
            values["log_vector_extent"] = max(values["log_vector_extent"], _log2(extent))
        elif kind is ForKind.UNROLLED:
            values["unrolled_loops"] += 1
            values["log_unrolled_extent"] += _log2(extent)
        else:
            values["serial_loops"] += 1
        if innermost and extent:
            inner_extents.append(extent)
    lanes = max(1, target.vector_bits // 32)
    if values["log_vector_extent"]:
        values["vector_lanes_ratio"] = 2 ** values["log_vector_extent"] / lanes
    if values["log_parallel_extent"]:
        values["parallel_tasks_per_thread"] = 2 ** values["log_parallel_extent"] / target.threads
    if inner_extents:
        values["log_inner_extent"] = float(np.mean([_log2(e) for e in inner_extents]))
    for node in walk(body):
        if isinstance(node, Store):
            values["stores"] += 1
            if getattr(node.value, "lanes", 1) > 1:
                values["vector_stores"] += 1
        elif isinstance(node, Load):
            values["loads"] += 1
        elif isinstance(node, IfThenElse):
            values["conditions"] += 1
        elif isinstance(node, Gemm):
            _gemm_features(node, target, values)
    values["threads"] = target.threads
    values["vector_bits"] = target.vector_bits
    values["log_l1"] = _log2(target.l1d_bytes)
    values["log_l2"] = _log2(target.l2_bytes)
    return np.array([values[name] for name in FEATURE_NAMES], dtype=np.float64)


def _gemm_features(gemm: Gemm, target: Target, values: dict[str, float]) -> None:
    """The biggest matrix product of the kernel describes it (a kernel rarely has two)."""
    batch = math.prod(extent for _, extent in gemm.batch) if gemm.batch else 1
    values["gemms"] += 1
    if values["gemm_log_m"] + values["gemm_log_n"] + values["gemm_log_k"] >= \
            _log2(gemm.m) + _log2(gemm.n) + _log2(gemm.k):
        return
    knobs = gemm.knobs
    values.update({
        "gemm_log_m": _log2(gemm.m), "gemm_log_n": _log2(gemm.n), "gemm_log_k": _log2(gemm.k),
        "gemm_log_batch": _log2(batch), "gemm_mr": knobs.mr, "gemm_nr": knobs.nr,
        "gemm_log_kc": _log2(knobs.kc), "gemm_log_mc": _log2(knobs.mc),
        "gemm_log_nc": _log2(knobs.nc), "gemm_pack_a": float(knobs.pack_a),
        "gemm_pack_in_task": float(knobs.pack_in_task), "gemm_parallel": float(knobs.parallel),
        "gemm_fold_batch": float(knobs.fold_batch), "gemm_b_in_place": float(knobs.b_in_place),
        "gemm_b_panels_in_place": float(knobs.b_panels_in_place),
        "gemm_vector_rows": float(knobs.vector_rows), "gemm_b_packed": float(gemm.b_packed),
        "gemm_a_packed": float(gemm.a_packed),
        "gemm_tile_accumulators": knobs.mr * knobs.nr / max(1, knobs.lanes),
    })
    values["gemm_row_waste"] = -(-gemm.m // knobs.mr) * knobs.mr / gemm.m
    values["gemm_column_waste"] = -(-gemm.n // knobs.nr) * knobs.nr / gemm.n
    columns = gemm.n * (batch if knobs.fold_batch else 1)
    tasks = -(-gemm.m // knobs.mc) * -(-columns // knobs.nc) * (1 if knobs.fold_batch else batch)
    values["gemm_log_tasks"] = _log2(tasks)
    values["gemm_tasks_per_thread"] = tasks / target.threads if knobs.parallel else 0.0
    values["gemm_panel_l1_ratio"] = knobs.kc * knobs.nr * 4 / target.l1d_bytes
    values["gemm_block_l2_ratio"] = knobs.mc * knobs.kc * 4 / target.l2_bytes


def _loops(stmt: Stmt, depth: int = 1) -> Iterator[tuple[For, int, bool]]:
    """Every loop with its depth and whether no loop is nested in it."""
    for node in _children_loops(stmt):
        nested = list(_loops(node.body, depth + 1))
        yield node, depth, not nested
        yield from nested


def _children_loops(stmt: Stmt) -> Iterator[For]:
    """The outermost loops inside ``stmt`` (not looking inside those)."""
    if isinstance(stmt, For):
        yield stmt
        return
    for node in children(stmt):
        if isinstance(node, Stmt):
            yield from _children_loops(node)
