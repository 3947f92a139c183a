"""The graph passes of each optimization level, in order: the optimization story in one place.

Read :data:`PIPELINES` top to bottom.  Each level is a named list of passes; the runner
(:func:`ember.passes.context.run_passes`) infers shapes after every pass that changed the
graph, so later passes and lowering always see exact static types, and runs the IR verifier
after every pass, so a pass that breaks an invariant (a dangling value, a constant whose array
is not its type) is named where it happened rather than found later as a crash in lowering or
a wrong result.  It also times each pass and, on request, prints the graph before and after
the passes named (``PassContext(dump=...)``), which is what ``ember inspect`` shows.

An opt level that is not listed here is an error naming the levels that are.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.core.errors import ConfigError
from ember.ir.graph import Graph
from ember.ops.registry import get_op
from ember.passes.context import GraphPass, PassContext, graph_pass, run_passes
from ember.passes.cse import eliminate_common_subexpressions
from ember.passes.dce import eliminate_dead_code
from ember.passes.block_convolutions import block_convolutions
from ember.passes.block_depthwise import block_depthwise_convolutions
from ember.passes.explicit_padding import make_padding_explicit
from ember.passes.fold_batchnorm import fold_batchnorm
from ember.passes.fold_constants import fold_constants
from ember.passes.fold_scale_bias import fold_scale_bias
from ember.passes.fuse import fuse, op_has_compute
from ember.passes.horizontal_fusion import fuse_horizontal
from ember.passes.lower_conv_transpose import lower_conv_transpose
from ember.passes.lower_einsum import lower_einsum
from ember.passes.recognize_attention import recognize_attention
from ember.passes.recognize_gelu import recognize_gelu
from ember.passes.recognize_hard_swish import recognize_hard_swish
from ember.passes.recognize_layer_norm import recognize_layer_norm
from ember.passes.recognize_softmax import recognize_softmax
from ember.passes.recognize_swish import recognize_swish
from ember.passes.simplify import simplify
from ember.passes.split_wide_variadic import split_wide_variadics
from ember.passes.unroll_recurrent import unroll_recurrent
from ember.ops.rnn import CELL_KINDS

# ---------------------------------------------------------------------- the passes

FOLD_CONSTANTS = GraphPass("fold_constants",
                           lambda graph, ctx: fold_constants(graph, ctx.memory_limit),
                           "evaluate nodes whose inputs are constants (within the memory budget)")
SIMPLIFY = graph_pass(simplify)
CSE = graph_pass(eliminate_common_subexpressions)
DCE = graph_pass(eliminate_dead_code)
SPLIT_WIDE_VARIADICS = graph_pass(split_wide_variadics)
FOLD_BATCHNORM = graph_pass(fold_batchnorm)
LOWER_CONV_TRANSPOSE = graph_pass(lower_conv_transpose)
UNROLL_RECURRENT = graph_pass(unroll_recurrent)
LOWER_EINSUM = graph_pass(lower_einsum)
FOLD_SCALE_BIAS = graph_pass(fold_scale_bias)
RECOGNIZE_SOFTMAX = graph_pass(recognize_softmax)
RECOGNIZE_LAYER_NORM = graph_pass(recognize_layer_norm)
RECOGNIZE_GELU = graph_pass(recognize_gelu)
RECOGNIZE_SWISH = graph_pass(recognize_swish)
RECOGNIZE_HARD_SWISH = graph_pass(recognize_hard_swish)
RECOGNIZE_ATTENTION = graph_pass(recognize_attention)
FUSE_HORIZONTAL = graph_pass(fuse_horizontal)
MAKE_PADDING_EXPLICIT = graph_pass(make_padding_explicit)
BLOCK_DEPTHWISE = GraphPass("block_depthwise_convolutions",
                            lambda graph, ctx: block_depthwise_convolutions(graph, ctx.target),
                            "depthwise convolutions over narrow images -> channels blocked by "
                            "the vector width (NCHWc), between two transposes")
BLOCK_CONVOLUTIONS = GraphPass("block_convolutions",
                               lambda graph, ctx: block_convolutions(graph, ctx.target),
                               "dense convolutions -> channels blocked by the vector width "
                               "(NCHWc), kept blocked through elementwise ops, pools and "
                               "depthwise convolutions between them")
FUSE = GraphPass("fuse",
                 lambda graph, ctx: fuse(graph, ctx.kernel_support or op_has_compute),
                 "group nodes into kernels (graph.groups); must run last: it does not "
                 "change the nodes, and a later rewrite would invalidate the groups")


def has_compute(op: str) -> bool:
    """Whether ``op`` has a compute definition: a composite without one would run as a numpy
    fallback, slower than the small ops it replaced."""
    opdef = get_op(op)
    return opdef is not None and opdef.compute is not None


# Ops without a compute definition that still end up as compiled code: the recurrent layers
# and Einsum (``unroll_recurrent`` and ``lower_einsum`` write them as ops that compile), and
# sizes (``Shape``, ``Size``: constants once specialization knows the shapes).
_REWRITTEN_BEFORE_LOWERING = frozenset(CELL_KINDS) | {"Shape", "Size", "Einsum"}


def becomes_compiled_code(op: str) -> bool:
    """Whether a node of ``op`` ends up as native code rather than a numpy reference run on
    the host.  Approximate where a rewrite can decline (a recurrent layer longer than
    ``MAX_UNROLLED_STEPS``): the build's ``host_nodes`` have the last word."""
    return has_compute(op) or op in _REWRITTEN_BEFORE_LOWERING


@dataclass(frozen=True)
class Pipeline:
    """A named, ordered list of graph passes."""

    name: str
    passes: tuple[GraphPass, ...]

    def __str__(self) -> str:
        return f"{self.name}: " + ", ".join(p.name for p in self.passes)


CLEANUP = (
    # Einsum -> transposes, reshapes, sums and batched MatMuls instead of the host reference;
    # first, so that folding then transposes constant operands (weights) once
    LOWER_EINSUM,
    FOLD_CONSTANTS,          # shape arithmetic, folded weights, Constant nodes
    # ConvTranspose -> stride-1 Conv(s) + pixel interleave; after folding, which may be what
    # makes its weights constant, and before the steps that tidy up what it adds
    LOWER_CONV_TRANSPOSE,
    # RNN/GRU/LSTM -> their time steps as nodes (one batched input projection, a small GEMM
    # and a fused gate kernel per step) instead of the host reference
    UNROLL_RECURRENT,
    SIMPLIFY,                # no-op Reshape/Transpose/Cast/..., x*1, transpose pairs
    CSE,                     # one copy of each value (and of each constant)
    DCE,                     # what nothing reads any more
    SPLIT_WIDE_VARIADICS,    # a Concat or Sum of hundreds of inputs -> a tree of narrow ones
)

PIPELINES: dict[int, Pipeline] = {
    0: Pipeline("O0 (every node as imported, one kernel per node)", ()),
    1: Pipeline("O1 (cleanup, ConvTranspose lowering, fusion)", (*CLEANUP, FUSE)),
    2: Pipeline("O2 (cleanup, folding into anchors, composites, horizontal fusion, "
                "fusion)", (
        *CLEANUP,
        # per-channel affine ops into the Conv/Gemm/MatMul before them
        FOLD_BATCHNORM,
        FOLD_SCALE_BIAS,
        # composites that exporters write as many small ops -> one op (one kernel)
        RECOGNIZE_SOFTMAX,       # before attention, which matches a Softmax node
        RECOGNIZE_LAYER_NORM,
        RECOGNIZE_GELU,
        RECOGNIZE_SWISH,
        RECOGNIZE_HARD_SWISH,
        # until Attention has a compute definition it would be a numpy fallback: then the
        # written-out form, whose MatMuls and Softmax compile, is faster
        *((RECOGNIZE_ATTENTION,) if has_compute("Attention") else ()),
        # sibling projections of one input (Q/K/V) -> one GEMM and a Split
        FUSE_HORIZONTAL,
        # what the rewrites leave: transpose pairs, duplicate constants, dead weights
        SIMPLIFY,
        CSE,
        DCE,
        BLOCK_CONVOLUTIONS,      # dense convs in NCHWc, the layout kept between them
        BLOCK_DEPTHWISE,         # narrow depthwise convs in NCHWc, padded in that layout
        MAKE_PADDING_EXPLICIT,   # convolution borders as a Pad: affine, vectorizable loads
        FUSE,                    # last: groups of nodes -> one kernel each
    )),
}


def pipeline_for(opt_level: int) -> Pipeline:
    """The pipeline of ``opt_level``; an error naming the valid levels for any other value."""
    if isinstance(opt_level, bool) or not isinstance(opt_level, int) or \
            opt_level not in PIPELINES:
        levels = ", ".join(f"{level} = {p.name}" for level, p in sorted(PIPELINES.items()))
        raise ConfigError(f"opt_level {opt_level!r} does not exist; ember's optimization "
                          f"levels are {levels}")
    return PIPELINES[opt_level]


def passes_for(opt_level: int) -> list[GraphPass]:
    return list(pipeline_for(opt_level).passes)


def optimize(graph: Graph, opt_level: int, log: list[str] | None = None,
             memory_limit: int | None = None, *, context: PassContext | None = None) -> Graph:
    """Run the passes of ``opt_level`` on ``graph`` in place; ``log`` collects
    ``"pass: changes"`` per pass.

    ``memory_limit`` (bytes; default ``ember.core.config.memory_limit()``) bounds what constant
    folding may allocate.  A ``context`` given by the caller receives the timings and IR dumps
    (its own memory limit is used when ``memory_limit`` is None).
    """
    passes = passes_for(opt_level)
    if context is None:
        context = PassContext(opt_level=opt_level, memory_limit=memory_limit)
    else:
        context.opt_level = opt_level
        if memory_limit is not None:
            context.memory_limit = memory_limit
    start = len(context.records)
    run_passes(graph, passes, context)
    if log is not None:
        log.extend(str(record) for record in context.records[start:])
    return graph
