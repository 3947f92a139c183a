"""Inline stages into the stages that read them, so intermediates need not be materialized.

A fused group's compute is a DAG of stages (one per ``compute`` of every member's definition).
Materializing each would write and re-read every intermediate through memory -- the one
kernel per node that fusion replaces.  This module decides which stages disappear into their
readers and rewrites the readers' bodies:

* a stage without a reduction (elementwise, broadcast, injective: a reshape, a transpose, a
  gather) is substituted into every read of it, its axes replaced by the reader's indices.
  When its body is expensive (a transcendental call, or large) and it is read more than once
  per element of the reader, it is materialized instead: recomputing ``exp`` for every use
  costs more than one store and one load;
* a stage with a reduction is substituted only into its single reader, when that reader reads
  it exactly at its own output index (once, or several times as ``x * erf(x)`` does) and
  reduces nothing itself: the reader's expression then becomes the reduction's *epilogue*
  (``relu(sum(...) + bias[j])``), applied to the accumulator before the one store.  Read at other indices (softmax's row maximum, broadcast
  over a row) a reduction stays materialized: recomputing it per element would multiply the
  work by the row length;
* a stage that is an output of the kernel is always materialized (in its output buffer), and
  its readers load it from there; so is a stage that scatters (``Stage.scatter``: its elements
  are not an expression of their index), and so is every stage its scattered writes read
  (their positions and values are evaluated once per write, in order).

Masked reads (a padded border) carry their mask into every load of the inlined body, so an
inlined producer never reads out of bounds either.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.ir.compute import Reduce, Stage, Tensor, unravel
from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import Binary, BufferLoad, Call, Const, Expr, Load
from ember.ir.loop.functor import children, rewrite, substitute, walk

# Math calls cheap enough to recompute at every use (a few instructions each).
CHEAP_CALLS = frozenset({"fabs", "floor", "ceil", "round", "nearbyint", "trunc", "isnan",
                         "isinf", "copysign"})
# A body with more expression nodes than this is worth materializing when read several times.
MAX_RECOMPUTED_NODES = 48
# Bounds of an inlined body: past them the producer is stored and its readers load it.  Far
# above what a real fused pattern needs (GELU, LayerNorm, attention's softmax: tens of nodes),
# they keep the expression trees that later walks and code generation recurse over shallow.
MAX_INLINED_NODES = 2000
MAX_INLINED_DEPTH = 48


@dataclass
class InlinePlan:
    """What inlining did: the stages left to lower (producers first, bodies rewritten) and
    the stages that were substituted into their readers."""

    stages: list[Stage]
    inlined: list[Stage]


def inline_stages(stages: list[Stage], outputs: list[Tensor]) -> InlinePlan:
    """Inline what pays into its readers; ``stages`` in topological order (producers first).

    Linear in the number of stages: which stages read a buffer is kept in an index updated as
    bodies are rewritten (not found by scanning every body for every stage), and a stage is
    only inlined while the reader's body stays within :data:`MAX_INLINED_NODES` nodes and
    :data:`MAX_INLINED_DEPTH` levels (a chain of a thousand elementwise nodes is cut into
    stored stages of bounded size, so no later walk recurses deeper than that).
    """
    output_buffers = {t.buffer for t in outputs}
    bodies: dict[int, Expr] = {id(s): s.body for s in stages}
    remaining: dict[int, Stage] = {id(s): s for s in stages}
    # buffer -> ids of the remaining stages whose current body reads it (insertion ordered)
    readers_of: dict[Buffer, dict[int, None]] = {}
    reads_of: dict[int, set[Buffer]] = {}
    for stage in stages:
        reads_of[id(stage)] = _read_buffers(stage.body)
        for buffer in reads_of[id(stage)]:
            readers_of.setdefault(buffer, {})[id(stage)] = None
    # read by the scattered writes of a stage: kept as buffers (see the module docstring)
    scatter_reads = {n.buffer for s in stages if s.scatter is not None
                     for expr in s.scatter.exprs() for n in walk(expr)
                     if isinstance(n, (BufferLoad, Load))}
    inlined: list[Stage] = []
    for stage in stages:
        buffer = stage.output.buffer
        if buffer in output_buffers or stage.scatter is not None or buffer in scatter_reads:
            continue
        readers = [remaining[i] for i in readers_of.get(buffer, {}) if i != id(stage)
                   and i in remaining]
        if not readers:  # dead (nothing in this kernel reads it): drop it
            _forget(stage, remaining, reads_of, readers_of)
            continue
        if not (_should_inline(stage, bodies[id(stage)], readers, bodies)
                and _stays_bounded(stage, bodies[id(stage)], readers, bodies)):
            continue
        for reader in readers:
            bodies[id(reader)] = _substitute_stage(bodies[id(reader)], stage,
                                                   bodies[id(stage)])
            reads = reads_of[id(reader)]
            reads.discard(buffer)
            for read in reads_of[id(stage)]:
                if read not in reads:
                    reads.add(read)
                    readers_of.setdefault(read, {})[id(reader)] = None
        _forget(stage, remaining, reads_of, readers_of)
        inlined.append(stage)
    rewritten = [Stage(s.axes, bodies[id(s)], s.output, s.inputs, s.scatter)
                 for s in remaining.values()]
    return InlinePlan(rewritten, inlined)


def _forget(stage: Stage, remaining: dict[int, Stage], reads_of: dict[int, set[Buffer]],
            readers_of: dict[Buffer, dict[int, None]]) -> None:
    """Drop ``stage`` from the remaining stages and from the reader index."""
    del remaining[id(stage)]
    for read in reads_of.pop(id(stage)):
        readers_of.get(read, {}).pop(id(stage), None)


def _stays_bounded(stage: Stage, body: Expr, readers: list[Stage],
                   bodies: dict[int, Expr]) -> bool:
    """Whether substituting ``body`` (``stage``'s) into every reader keeps each reader's body
    within the size and depth bounds (an upper estimate: the depths add up, the size grows
    by the body's for every read of the stage)."""
    size, depth = expression_size(body)
    buffer = stage.output.buffer
    for reader in readers:
        reader_size, reader_depth = expression_size(bodies[id(reader)])
        reads = sum(1 for n in walk(bodies[id(reader)])
                    if isinstance(n, (BufferLoad, Load)) and n.buffer == buffer)
        if reader_depth + depth > MAX_INLINED_DEPTH or \
                reader_size + size * max(reads, 1) > MAX_INLINED_NODES:
            return False
    return True


def expression_size(body: Expr) -> tuple[int, int]:
    """The number of nodes and the depth of an expression tree (iterative: a tree of any
    depth is measured without recursion)."""
    size, deepest = 0, 0
    pending: list[tuple[object, int]] = [(body, 1)]
    while pending:
        node, depth = pending.pop()
        size += 1
        deepest = max(deepest, depth)
        for child in children(node):
            pending.append((child, depth + 1))
    return size, deepest


def _read_buffers(body: Expr) -> set[Buffer]:
    return {n.buffer for n in walk(body) if isinstance(n, (BufferLoad, Load))}


def _should_inline(stage: Stage, body: Expr, readers: list[Stage],
                   bodies: dict[int, Expr]) -> bool:
    buffer = stage.output.buffer
    reads = [(r, n) for r in readers for n in walk(bodies[id(r)])
             if isinstance(n, (BufferLoad, Load)) and n.buffer == buffer]
    if any(isinstance(n, Load) for _, n in reads):
        return False  # read through a flat offset already: only a buffer can serve it
    if _has_reduce(body):
        reader = reads[0][0]
        if any(r is not reader for r, _ in reads):
            return False
        # every read at the reader's own index (an epilogue may use the value twice, as
        # x * erf(x) does: the reduction is still computed once, see lower._lower_stage)
        return (not _has_reduce(bodies[id(reader)])
                and reader.output.shape == stage.output.shape
                and all(access.mask is None and not access.flat
                        and at_own_index(access, reader) for _, access in reads))
    if len(reads) == 1:
        return True
    return not _expensive(body)


def at_own_index(access: BufferLoad, reader: Stage) -> bool:
    """Whether ``access`` reads element ``i`` where ``reader`` writes element ``i`` (an axis
    of extent 1 may be indexed by the constant 0, as broadcasting code writes it)."""
    if len(access.indices) != len(reader.axes):
        return False
    for index, axis, extent in zip(access.indices, reader.axes, reader.output.shape):
        if index == axis:
            continue
        if extent == 1 and isinstance(index, Const) and index.value == 0:
            continue
        return False
    return True


def _expensive(body: Expr) -> bool:
    nodes = list(walk(body))
    if len(nodes) > MAX_RECOMPUTED_NODES:
        return True
    return any(isinstance(n, Call) and n.name not in CHEAP_CALLS for n in nodes)


def _has_reduce(body: Expr) -> bool:
    return any(isinstance(n, Reduce) for n in walk(body))


def _substitute_stage(reader_body: Expr, stage: Stage, stage_body: Expr) -> Expr:
    """``reader_body`` with every read of ``stage`` replaced by the stage's expression."""
    buffer = stage.output.buffer

    def replace(node):
        if not (isinstance(node, BufferLoad) and node.buffer == buffer):
            return None
        indices = (unravel(node.indices[0], stage.output.shape) if node.flat
                   else list(node.indices))
        value = substitute(stage_body, dict(zip(stage.axes, indices)))
        return value if node.mask is None else mask_reads(value, node.mask)

    return rewrite(reader_body, replace)


def mask_reads(value: Expr, mask: Expr) -> Expr:
    """``value`` with ``mask`` added to every load in it: where the mask is false (outside a
    padded border, say) the inlined expression must not read memory either."""

    def add_mask(node):
        if isinstance(node, (BufferLoad, Load)):
            combined = mask if node.mask is None else Binary("and", node.mask, mask)
            return type(node)(**{**_fields(node), "mask": combined})
        return None

    return rewrite(value, add_mask)


def _fields(node) -> dict:
    import dataclasses

    return {f.name: getattr(node, f.name) for f in dataclasses.fields(node)}
