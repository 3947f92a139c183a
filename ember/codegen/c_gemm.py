"""C for the GEMM template: a :class:`~ember.ir.loop.stmt.Gemm` statement expanded.

The structure is GotoBLAS/BLIS's, with every size a compile-time constant::

    [pack B into panels of NR columns (unless packed at compile time)]
    parallel for each task (batch element, block of MC rows, block of NC columns):
      for each block of KC reduction terms:
        for each NR-column panel of the block:     # a KC x NR panel of B stays in L1
          for each MR-row strip of the block:      # A streams from L2
            micro-kernel: MR x NR tile in registers, accumulated over KC terms
            after the last block: the fused epilogue on the tile, still in L1

Three variations: with the batch folded into the columns (``fold_batch``) one product spans
every batch element, and with the output's columns in runs apart (``out_j_dims``: the rows of
a padded buffer) they are not one run -- in both each task accumulates its block in a stack
scratch and the epilogue stores each tile row run by run where the run belongs; and a task
that packs its own panels of a gathered B leaves those that are one run of B's columns where
they are (``b_panels_in_place``: a stride-1 convolution's panel within one output row), the
micro-kernel reading their rows through a table of the reduction's offsets.

The micro-kernel is written with explicit vector types (GCC/Clang vector extensions) of the
target's width, so the same source gives AVX-512, AVX2+FMA, NEON or WASM SIMD code, and with
``-ffp-contract=fast`` every multiply-add is one FMA.  One micro-kernel per tile height
(1..MR rows) covers the short last strip without a scalar loop; the last, narrower panel is
zero padded in the packed B and stored through a small buffer, so no tail falls back to
scalar code either.  Vectors are moved with ``memcpy`` (one unaligned vector load or store
after optimization), which keeps the code free of alignment and aliasing undefined
behaviour.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Callable, Iterator

from ember.core.traced import is_traced
from ember.codegen.c_helpers import HelperSet
from ember.ir.loop.buffer import Buffer
from ember.ir.loop.expr import INDEX, Const, Expr, Load, Var
from ember.ir.loop.functor import substitute
from ember.ir.loop.simplify import simplify
from ember.ir.loop.stmt import For, ForKind, Gemm, Store

if TYPE_CHECKING:
    from ember.codegen.c import _KernelEmitter

# Elements copied from which the up-front packing of B is shared among threads (whether the
# product's tasks are is its ``GemmKnobs.parallel``, decided by the schedule).
PACK_PARALLEL_WORK = 1 << 17

# Tasks smaller than this (multiply-adds) are claimed a few at a time, each thread taking at
# least CLAIMS_PER_THREAD claims (see _tasks_per_claim).
MIN_CLAIMED_WORK = 1 << 16
CLAIMS_PER_THREAD = 4

# Independent multiply-adds a micro-kernel keeps in flight: two FMA units of four cycles'
# latency (Zen 3 and 4, Intel since Skylake).  A tile with fewer accumulators splits its
# reduction into up to MAX_REDUCTION_SPLITS partial sums (see reduction_splits).
MIN_FMA_CHAINS = 8
MAX_REDUCTION_SPLITS = 4

# Tasks are handed out one at a time (chunks of one task), not split in fixed halves: on a
# shared machine a worker often starts late (its vCPU was idle, or another process holds it),
# and with a static split the caller would then wait for the late worker's whole half.  A
# task is about a million multiply-adds, so taking one costs nothing in comparison.


def vector_type(helpers: HelperSet, lanes: int) -> str:
    """``ember_vf32xL``: a vector of ``lanes`` floats."""
    name = f"ember_vf32x{lanes}"
    return helpers.need(name, lambda: (
        f"typedef float {name} __attribute__((vector_size({4 * lanes})));"))


def unaligned_vector_type(helpers: HelperSet, lanes: int) -> str:
    """``ember_vf32xL_u``: a vector of ``lanes`` floats at any float's alignment (a vector
    type aliases its element type, so it may load and store float arrays)."""
    name = f"ember_vf32x{lanes}_u"
    return helpers.need(name, lambda: (
        f"typedef float {name} __attribute__((vector_size({4 * lanes}), aligned(4)));"))


def micro_kernel(helpers: HelperSet, rows: int, vectors: int, lanes: int,
                 indirect: bool = False, a_indirect: bool = False) -> str:
    """The ``rows x (vectors * lanes)`` micro-kernel: ``c (+)= a[rows x kc] * b[kc x nr]``
    with ``b`` a panel of ``nr`` contiguous floats per reduction step, ``b_rs`` apart (``nr``
    when packed), and ``a`` read through its strides.  ``accumulate`` adds to the tile in
    ``c`` (a later reduction block) instead of starting from zero; only the first ``cols``
    columns of ``c`` are read and written.  Inlined into its caller.  The ``indirect`` form
    reads row ``k`` of B at ``b + koff[k]`` (a panel read where it lies in the input, see
    :func:`_emit_pack_panel`); the ``a_indirect`` form reads A's element ``(r, k)`` at
    ``a + r * a_rs + aoff[k]`` (A read in place along a walk of several strides,
    ``Gemm.a_k_dims``)."""
    vec = vector_type(helpers, lanes)
    name = f"ember_gemm_f32_{rows}x{vectors * lanes}_v{lanes}" + \
        ("_ind" if indirect else "") + ("_aind" if a_indirect else "")
    return helpers.need(name, lambda: _micro_kernel_source(
        f"static inline __attribute__((always_inline)) void {name}", rows, vectors, lanes, vec,
        packed_rows=None, indirect=indirect, a_indirect=a_indirect))


def packed_micro_kernel(helpers: HelperSet, rows: int, vectors: int, lanes: int,
                        mr: int, indirect: bool = False) -> str:
    """The micro-kernel over an A packed in strips of ``mr`` rows (``a[k * mr + r]``),
    defined in the shared unit of :func:`shared_gemm_unit` and declared here: kernels
    call it rather than each compiling its own copy, which made a GEMM unit half again as
    slow to compile.  A call per ``rows x nr x kc`` tile costs nothing beside it."""
    vector_type(helpers, lanes)
    name = _packed_name(rows, vectors, lanes, mr, indirect)
    params = _INDIRECT_PARAMS if indirect else _PACKED_PARAMS
    helpers.need(name, lambda: f"EMBER_INTERNAL void {name}{params};")
    return name


def shared_gemm_unit(prelude: str, vectors: int, lanes: int, mr: int) -> str:
    """The unit defining every packed-A micro-kernel of this tile shape (all heights up to
    ``mr``), the same text in every model: one object, compiled once per machine."""
    helpers = HelperSet()
    vec = vector_type(helpers, lanes)
    parts = [prelude, helpers.source()]
    for indirect in (False, True):
        for rows in range(1, mr + 1):
            name = _packed_name(rows, vectors, lanes, mr, indirect)
            parts.append(_micro_kernel_source(f"EMBER_INTERNAL void {name}", rows, vectors,
                                              lanes, vec, packed_rows=mr, indirect=indirect))
    return "\n\n".join(parts) + "\n"


_PACKED_PARAMS = ("(long kc, const float *restrict a, const float *restrict b, long b_rs, "
                  "float *restrict c, long c_rs, int accumulate, long cols)")
_INDIRECT_PARAMS = ("(long kc, const float *restrict a, const float *restrict b, "
                    "const long *restrict koff, float *restrict c, long c_rs, int accumulate, "
                    "long cols)")


def _packed_name(rows: int, vectors: int, lanes: int, mr: int, indirect: bool = False) -> str:
    return f"ember_gemm_packed_f32_{rows}x{vectors * lanes}_s{mr}_v{lanes}" + \
        ("_ind" if indirect else "")


def _micro_kernel_source(head: str, rows: int, vectors: int, lanes: int, vec: str,
                         packed_rows: int | None, indirect: bool = False,
                         a_indirect: bool = False) -> str:
    """The C of a micro-kernel: ``a`` through its strides (``a_indirect``: its row stride
    and a table of its reduction offsets), or packed in strips of ``packed_rows`` rows; B's
    row ``k`` at ``b + k * b_rs``, or (``indirect``) at ``b + koff[k]``."""
    nr = vectors * lanes
    acc = [[f"c{r}_{v}" for v in range(vectors)] for r in range(rows)]
    every = [(r, v) for r in range(rows) for v in range(vectors)]
    b_param = "const long *restrict koff" if indirect else "long b_rs"
    b_row = "koff[{k}]" if indirect else "{k} * b_rs"
    if packed_rows is None and a_indirect:
        params = ["    long kc, const float *restrict a, long a_rs, const long *restrict aoff,",
                  f"    const float *restrict b, {b_param}, float *restrict c, long c_rs, "
                  "int accumulate,", "    long cols) {"]
        a_element = "a[{r} * a_rs + aoff[{k}]]"
    elif packed_rows is None:
        params = ["    long kc, const float *restrict a, long a_rs, long a_cs,",
                  f"    const float *restrict b, {b_param}, float *restrict c, long c_rs, "
                  "int accumulate,", "    long cols) {"]
        a_element = "a[{r} * a_rs + {k} * a_cs]"
    else:
        signature = _INDIRECT_PARAMS if indirect else _PACKED_PARAMS
        params = [signature.strip("()").join(("    ", ") {"))]
        a_element = f"a[{{k}} * {packed_rows} + {{r}}]"
    lines = [
        f"{head}(",
        *params,
        f"  {vec} " + ", ".join(acc[r][v] + " = {0}" for r, v in every) + ";",
        "  if (accumulate) {",
        f"    if (cols == {nr}) {{",
        *[f"      __builtin_memcpy(&{acc[r][v]}, c + {r} * c_rs + {v * lanes}, "
          f"sizeof({vec}));" for r, v in every],
        "    } else {",
        f"      float edge[{nr}] = {{0}};",
        *[line for r in range(rows) for line in (
            f"      for (long q = 0; q < cols; ++q) edge[q] = c[{r} * c_rs + q];",
            *[f"      __builtin_memcpy(&{acc[r][v]}, edge + {v * lanes}, sizeof({vec}));"
              for v in range(vectors)])],
        "    }",
        "  }",
        *_reduction_loop(rows, vectors, lanes, vec, acc, a_element, b_row),
        f"  if (cols == {nr}) {{",
        *[f"    __builtin_memcpy(c + {r} * c_rs + {v * lanes}, &{acc[r][v]}, "
          f"sizeof({vec}));" for r, v in every],
        "  } else {",
        f"    float edge[{nr}];",
        *[line for r in range(rows) for line in (
            *[f"    __builtin_memcpy(edge + {v * lanes}, &{acc[r][v]}, sizeof({vec}));"
              for v in range(vectors)],
            f"    for (long q = 0; q < cols; ++q) c[{r} * c_rs + q] = edge[q];")],
        "  }",
        "}",
    ]
    return "\n".join(lines)


def reduction_splits(rows: int, vectors: int) -> int:
    """How many partial sums each accumulator of a ``rows x vectors`` tile keeps: enough
    that ``MIN_FMA_CHAINS`` multiply-adds are independent.  A tile of one or two rows (a
    matrix-vector product: a batch-1 ``nn.Linear``, a recurrent layer's step) has two to four
    accumulators, and each multiply-add waited for the one before it on the same one."""
    return max(1, min(MAX_REDUCTION_SPLITS, -(-MIN_FMA_CHAINS // (rows * vectors))))


def _reduction_loop(rows: int, vectors: int, lanes: int, vec: str, acc: list[list[str]],
                    a_element: str, b_row: str) -> list[str]:
    """The micro-kernel's loop over its ``kc`` terms.  With several partial sums per
    accumulator (:func:`reduction_splits`) consecutive terms go to different ones (a tail of
    fewer terms to the first), added together after the loop."""
    splits = reduction_splits(rows, vectors)

    def step(k: str, part: int, indent: str) -> list[str]:
        suffix = f"_{part}" if part else ""
        return [
            *[f"{indent}{vec} b{v}{suffix}; __builtin_memcpy(&b{v}{suffix}, b + "
              f"{b_row.format(k=k)} + {v * lanes}, sizeof({vec}));" for v in range(vectors)],
            *[line for r in range(rows) for line in (
                f"{indent}const float a{r}{suffix} = "
                f"{a_element.format(r=r, k=k)};",
                *[f"{indent}{acc[r][v]}{'_p' + str(part) if part else ''} += "
                  f"a{r}{suffix} * b{v}{suffix};" for v in range(vectors)])]]

    if splits == 1:
        # unrolled by 4: measured 2-9 % faster on the zoo's GEMM shapes (AVX2, Zen)
        return ["  _Pragma(\"GCC unroll 4\")", "  for (long k = 0; k < kc; ++k) {",
                *step("k", 0, "    "), "  }"]
    partial = [f"{acc[r][v]}_p{part}" for part in range(1, splits) for r in range(rows)
               for v in range(vectors)]
    return [
        f"  {vec} " + ", ".join(name + " = {0}" for name in partial) + ";",
        "  long k = 0;",
        f"  for (; k + {splits} <= kc; k += {splits}) {{",
        *[line for part in range(splits)
          for line in step(f"(k + {part})" if part else "k", part, "    ")],
        "  }",
        "  for (; k < kc; ++k) {",
        *step("k", 0, "    "),
        "  }",
        *[f"  {acc[r][v]} += "
          + " + ".join(f"{acc[r][v]}_p{part}" for part in range(1, splits)) + ";"
          for r in range(rows) for v in range(vectors)],
    ]


def emit_gemm(em: "_KernelEmitter", s: Gemm, depth: int) -> None:
    """Append the C of ``s`` to the kernel being emitted by ``em``."""
    knobs = s.knobs
    batch = 1
    for _, extent in s.batch:
        batch *= extent
    # B differs per batch element and its copies do not all fit the scratch: one at a time
    per_element = s.pack is not None and s.b_moves_with_batch and s.pack.shape[0] == 1 and \
        not knobs.fold_batch
    blocks_m, blocks_n, _ = _task_grid(s)
    blocks = blocks_m * blocks_n
    folded = " folded into the columns" if knobs.fold_batch else ""
    em.line(depth, f"{{ /* gemm {s.m}x{s.n}x{s.k}" + (f" x {batch}{folded}" if batch > 1 else "")
            + f": tile {knobs.mr}x{knobs.nr}, kc {knobs.kc}, tasks of "
            f"{knobs.mc}x{knobs.nc} */")
    pack_in_task = knobs.pack_in_task
    if knobs.fold_batch:
        # one product of batch x n columns: the tasks' columns span the batch elements, whose
        # variables the packing and the epilogue decode per column
        if s.pack is not None and not pack_in_task:
            _emit_pack(em, s, depth + 1)
        _emit_tasks(em, s, depth + 1, blocks, None, pack_in_task)
    elif per_element:
        # B differs per batch element: pack and multiply one element at a time
        bt = em.names.fresh("bt")
        em.line(depth + 1, f"for (long {bt} = 0; {bt} < {batch}; ++{bt}) {{")
        with _batch_bindings(em, s, bt, depth + 2):
            if not pack_in_task:
                _emit_pack(em, s, depth + 2)
            _emit_tasks(em, s, depth + 2, blocks, None, pack_in_task)
        em.line(depth + 1, "}")
    else:
        if s.pack is not None and not pack_in_task:
            _emit_pack(em, s, depth + 1, copies=s.pack.shape[0])
        _emit_tasks(em, s, depth + 1, blocks * batch, blocks if s.batch else None,
                    pack_in_task)
    em.line(depth, "}")


def _panels(s: Gemm) -> int:
    return -(-s.columns // s.knobs.nr)


def _task_grid(s: Gemm) -> tuple[int, int, int]:
    """(row blocks, column blocks, panels per column block) of one batch element's tasks."""
    panels_per_task = s.knobs.nc // s.knobs.nr
    return -(-s.m // s.knobs.mc), -(-_panels(s) // panels_per_task), panels_per_task


def _emit_tasks(em: "_KernelEmitter", s: Gemm, depth: int, tasks: int,
                blocks_per_element: int | None, pack_in_task: bool = False) -> None:
    """The parallel loop over tasks (blocks of rows x panels, and batch elements when
    ``blocks_per_element`` is given: then the batch variables are decoded per task); with
    ``pack_in_task``, each task first packs its own panels of B (``GemmKnobs.pack_in_task``)."""
    knobs = s.knobs
    mr, nr, lanes = knobs.mr, knobs.nr, knobs.lanes
    pack_a = knobs.pack_a and not s.a_packed
    # With A packed in strips, a module of units calls the shared micro-kernels (see
    # packed_micro_kernel); one translation unit inlines its own.
    shared = em.ctx.shared_gemm and (s.a_packed or pack_a)
    # a kernel per row count a tile can have: up to MR, or M when fewer (a run-time M of a
    # traced build may leave any count)
    most_rows = mr if is_traced(s.m) else min(mr, s.m)

    turned = knobs.vector_rows
    if turned:
        # (the tile turned around: B's panel columns are the broadcast rows of the kernel,
        # A's strip rows its vectors)
        most_rows = knobs.nr if is_traced(s.columns) else min(knobs.nr, s.columns)

    def kernels_of(vectors: int, indirect: bool = False) -> dict[int, str]:
        strip = nr if turned else mr
        if not shared and not turned and not is_traced(s.m):
            # (inlined: one per height a strip has -- the full tile and the last strip's;
            # a task's rows start at a multiple of the tile's)
            heights = sorted({most_rows, s.m % mr or most_rows})
            return {rows: micro_kernel(em.ctx.helpers, rows, vectors, lanes, indirect,
                                       a_indirect=s.a_gathered) for rows in heights}
        if s.a_gathered:  # (a traced M: every height)
            return {rows: micro_kernel(em.ctx.helpers, rows, vectors, lanes, indirect,
                                       a_indirect=True) for rows in range(1, most_rows + 1)}
        if shared:
            em.ctx.shared_gemm_tiles.add((vectors, lanes, strip))
            return {rows: packed_micro_kernel(em.ctx.helpers, rows, vectors, lanes, strip,
                                              indirect)
                    for rows in range(1, most_rows + 1)}
        return {rows: micro_kernel(em.ctx.helpers, rows, vectors, lanes, indirect)
                for rows in range(1, most_rows + 1)}

    kernels = kernels_of(knobs.vector_width // lanes)
    # Panels read where they lie in B (GemmKnobs.b_panels_in_place): the full panels that
    # are one run of B's columns; the micro-kernel finds row k at koff[k] from the run.
    in_place = pack_in_task and knobs.b_panels_in_place
    direct_kernels = kernels_of(nr // lanes, indirect=True) if in_place else None
    # The last panel, when it holds few columns (a 7x7 image is 3 panels of 16 and one of
    # 1), is multiplied by a narrower micro-kernel: as many vectors as its columns need,
    # not NR's worth of multiply-adds on zero padding.
    # (A run-time N leaves any count of columns there: its last panel takes the full one.)
    tail_vectors = 0 if is_traced(s.columns) or turned else -(-(s.columns % nr) // lanes)
    narrow = kernels_of(tail_vectors) if 0 < tail_vectors < nr // lanes else None
    panels = _panels(s)
    blocks_m, blocks_n, panels_per_task = _task_grid(s)
    fresh, line = em.names.fresh, em.line
    task = fresh("task")
    # (a traced count goes to the pool whatever it is at run time -- one task runs inline --
    # so that the code does not depend on which side of 1 the traced sample fell)
    parallel = knobs.parallel and (is_traced(tasks) or tasks > 1)

    def task_body(inner: int) -> None:
        bt, tm, tn = fresh("bt"), fresh("tm"), fresh("tn")
        line(inner, f"const long {bt} = {task} / {blocks_m * blocks_n}, "
                    f"{tm} = ({task} / {blocks_n}) % {blocks_m}, {tn} = {task} % {blocks_n};")
        line(inner, f"(void){bt};")
        with _batch_bindings(em, s if blocks_per_element else None, bt, inner):
            a_base = em.exprs.expr(s.a_base)
            # (folded, the output's base depends on the batch element of each column)
            out_base = None if knobs.fold_batch else em.exprs.expr(s.out_base)
            b_panels = em._buffer(s.pack) if s.pack is not None else em._buffer(s.b)
            if s.pack is not None and s.pack.shape[0] > 1:  # this batch element's panels
                b_panels = f"({b_panels} + {bt} * {s.pack.shape[1] * s.k * nr})"
            i_lo, i_hi, p_lo, p_hi = fresh("i_lo"), fresh("i_hi"), fresh("p_lo"), fresh("p_hi")
            line(inner, f"const long {i_lo} = {tm} * {knobs.mc}, "
                        f"{i_hi} = {i_lo} + {knobs.mc} < {s.m} ? {i_lo} + {knobs.mc} : {s.m};")
            line(inner, f"const long {p_lo} = {tn} * {panels_per_task}, "
                        f"{p_hi} = {p_lo} + {panels_per_task} < {panels} ? "
                        f"{p_lo} + {panels_per_task} : {panels};")
            koff, sources, aoff = fresh("koff"), fresh("panel_at"), fresh("aoff")
            if s.a_gathered:
                offsets = ", ".join(str(o) for o in _walk_offsets(s.a_k_dims))
                line(inner, f"static const long {aoff}[{s.k}] = {{{offsets}}};")
            if in_place:
                offsets = ", ".join(str(o) for o in _walk_offsets(s.b_k_dims))
                line(inner, f"static const long {koff}[{s.k}] = {{{offsets}}};")
                line(inner, f"const float *{sources}[{panels_per_task}];")
            if pack_in_task:  # this task's panels of B, every k, into their place in the pack
                packing = fresh("pp")
                line(inner, f"for (long {packing} = {p_lo}; {packing} < {p_hi}; ++{packing}) {{")
                names = tuple(fresh(n) for n in ("q", "kk", "j", "rest", "joff", "src", "dst"))
                _emit_pack_panel(em, s, inner + 1, packing, bt if s.pack.shape[0] > 1 else "0", 0,
                                 names, f"{sources}[{packing} - {p_lo}]" if in_place else None)
                line(inner, "}")
            pc, kc, p, i0, j0 = fresh("pc"), fresh("kc"), fresh("p"), fresh("i0"), fresh("j0")
            rows, cols, panel, tile = fresh("rows"), fresh("cols"), fresh("panel"), fresh("tile")
            apack = fresh("apack")
            if pack_a:
                line(inner, f"float {apack}[{knobs.mc * knobs.kc}] __attribute__((aligned(64)));")
            ctile = fresh("ctile")
            if s.stores_by_runs:
                # the task's block of the product accumulates here: a tile's columns may
                # belong to two batch elements, or two runs of the output, which are apart
                line(inner, f"float {ctile}[{knobs.mc * knobs.nc}] "
                            f"__attribute__((aligned(64)));")
            line(inner, f"for (long {pc} = 0; {pc} < {s.k}; {pc} += {knobs.kc}) {{")
            line(inner + 1, f"const long {kc} = {s.k} - {pc} < {knobs.kc} ? {s.k} - {pc} : "
                            f"{knobs.kc};")
            if pack_a:
                # A's block, MR-row strips of kc steps each: the micro-kernel reads it in order
                line(inner + 1, f"for (long r = {i_lo}; r < {i_hi}; ++r) {{")
                line(inner + 2, f"float *strip = {apack} + ((r - {i_lo}) / {mr}) * {kc} * {mr} + "
                                f"(r - {i_lo}) % {mr};")
                line(inner + 2, f"const float *from = {em._buffer(s.a)} + ({a_base}) + "
                                f"r * {s.a_rs} + {pc} * {s.a_cs};")
                line(inner + 2, f"for (long k = 0; k < {kc}; ++k) strip[k * {mr}] = "
                                f"from[k * {s.a_cs}];")
                line(inner + 1, "}")
            line(inner + 1, f"for (long {p} = {p_lo}; {p} < {p_hi}; ++{p}) {{")
            line(inner + 2, f"const long {j0} = {p} * {nr}, "
                            f"{cols} = {s.columns} - {j0} < {nr} ? {s.columns} - {j0} : {nr};")
            b_row = fresh("b_row")
            if s.b_direct:
                full = s.n // nr
                b_in_place = f"{em._buffer(s.b)} + ({em.exprs.expr(s.b_base)}) + {p} * {nr} + " \
                    f"{pc} * {s.b_k_dims[0][1]}"
                packed = f"{b_panels} + ({p} - {full}) * {s.k * nr} + {pc} * {nr}" \
                    if s.pack is not None else b_in_place
                line(inner + 2, f"const int in_place = {p} < {full};")
                line(inner + 2, f"const float *{panel} = in_place ? {b_in_place} : {packed};")
                line(inner + 2, f"const long {b_row} = in_place ? {s.b_k_dims[0][1]} : {nr};")
            else:
                line(inner + 2, f"const float *{panel} = {b_panels} + {p} * {s.k * nr} + "
                                f"{pc} * {nr};")
                line(inner + 2, f"const long {b_row} = {nr};")
            line(inner + 2, f"for (long {i0} = {i_lo}; {i0} < {i_hi}; {i0} += {mr}) {{")
            body = inner + 3
            line(body, f"const long {rows} = {i_hi} - {i0} < {mr} ? {i_hi} - {i0} : {mr};")
            if turned:
                _emit_turned_tile(em, s, body, kernels, shared, {
                    "panel": panel, "ctile": ctile, "p": p, "p_lo": p_lo, "i0": i0,
                    "i_lo": i_lo, "pc": pc, "kc": kc, "j0": j0, "rows": rows, "cols": cols})
            else:
                if s.stores_by_runs:
                    c_rs = knobs.nc
                    line(body, f"float *{tile} = {ctile} + ({i0} - {i_lo}) * {c_rs} + "
                               f"({p} - {p_lo}) * {nr};")
                else:
                    c_rs = s.out_rs
                    line(body, f"float *{tile} = {em._buffer(s.out)} + ({out_base}) + "
                               f"{i0} * {s.out_rs} + {j0};")
                if s.a_packed:  # strips packed at compile time (i0 is a multiple of MR)
                    a_tile = f"{em._buffer(s.a)} + ({i0} / {mr}) * {s.k * mr} + {pc} * {mr}"
                    a_rs, a_cs = 1, mr
                elif pack_a:
                    a_tile = f"{apack} + (({i0} - {i_lo}) / {mr}) * {kc} * {mr}"
                    a_rs, a_cs = 1, mr
                elif s.a_gathered:  # in place, its reduction offsets from the table
                    a_tile = f"{em._buffer(s.a)} + ({a_base}) + {i0} * {s.a_rs}"
                    a_rs, a_cs = s.a_rs, f"{aoff} + {pc}"
                else:
                    a_tile = f"{em._buffer(s.a)} + ({a_base}) + {i0} * {s.a_rs} + " \
                        f"{pc} * {s.a_cs}"
                    a_rs, a_cs = s.a_rs, s.a_cs
                # (``accumulate`` stays a run-time flag: one inlined copy per flag value doubled
                # the code of every GEMM and made ResNet-18's convolutions slower, 34 -> 44 ms)
                strides = "" if shared else f"{a_rs}, {a_cs}, "
                call = (f"({kc}, {a_tile}, {strides}{panel}, {b_row}, {tile}, {c_rs}, "
                        f"{pc} != 0, {cols});")
                packed = body
                if direct_kernels is not None:
                    at = f"{sources}[{p} - {p_lo}]"
                    line(body, f"if ({at}) {{  /* the panel where it lies in B */")
                    direct_call = (f"({kc}, {a_tile}, {strides}{at}, {koff} + {pc}, {tile}, "
                                   f"{c_rs}, {pc} != 0, {cols});")
                    _emit_micro_call(em, body + 1, direct_kernels, rows, direct_call)
                    line(body, "} else {")
                    packed = body + 1
                if narrow is None:
                    _emit_micro_call(em, packed, kernels, rows, call)
                else:
                    line(packed, f"if ({p} < {panels - 1}) {{")
                    _emit_micro_call(em, packed + 1, kernels, rows, call)
                    line(packed, "} else {")
                    _emit_micro_call(em, packed + 1, narrow, rows, call)
                    line(packed, "}")
                if direct_kernels is not None:
                    line(body, "}")
                if s.stores_by_runs:
                    line(body, f"if ({pc} + {kc} == {s.k}) {{")
                    _emit_run_epilogue(em, s, body + 1, tile, c_rs,
                                       {"i0": i0, "j0": j0, "rows": rows, "cols": cols})
                    line(body, "}")
                elif s.finish is not None:
                    line(body, f"if ({pc} + {kc} == {s.k}) {{")
                    # (one vector of columns, always full -- a blocked convolution's lanes:
                    # each row of the epilogue is one vector operation)
                    one_vector = not is_traced(s.n) and s.n == nr == lanes
                    _emit_epilogue(em, s, body + 1, {"i0": i0, "j0": j0, "rows": rows,
                                                     "cols": str(nr) if one_vector else cols},
                                   one_vector=one_vector)
                    line(body, "}")
            for level in range(inner + 2, inner - 1, -1):
                line(level, "}")

    _task_loop(em, depth, tasks, task, task_body, parallel,
               chunk=_tasks_per_claim(s, tasks, em.ctx.target.threads))


def _emit_turned_tile(em: "_KernelEmitter", s: Gemm, depth: int, kernels: dict[int, str],
                      shared: bool, names: dict[str, str]) -> None:
    """One tile of a product with its rows along the vectors (``GemmKnobs.vector_rows``):
    the micro-kernel broadcasts the panel's columns of B (its "rows", 1..NR) against A's
    compile-time strip of MR rows (its vectors), into the task's scratch, which holds the
    block column by column (a column's MC rows consecutive); after the last reduction block
    the tile goes to the output transposed, through the epilogue."""
    knobs = s.knobs
    mr, nr, mc = knobs.mr, knobs.nr, knobs.mc
    panel, ctile, p, p_lo, i0, i_lo, pc, kc, rows, cols = (names[key] for key in (
        "panel", "ctile", "p", "p_lo", "i0", "i_lo", "pc", "kc", "rows", "cols"))
    tile = em.names.fresh("tile")
    em.line(depth, f"float *{tile} = {ctile} + ({p} - {p_lo}) * {nr * mc} + ({i0} - {i_lo});")
    strip = f"{em._buffer(s.a)} + ({i0} / {mr}) * {s.k * mr} + {pc} * {mr}"
    strides = "" if shared else f"1, {nr}, "   # the panel, read as an A of NR-row strips
    # (the kernel's "cols" are the strip's rows that exist: A's last strip may be short)
    call = f"({kc}, {panel}, {strides}{strip}, {mr}, {tile}, {mc}, {pc} != 0, {rows});"
    _emit_micro_call(em, depth, kernels, cols, call)
    em.line(depth, f"if ({pc} + {kc} == {s.k}) {{")
    _emit_run_epilogue(em, s, depth + 1, tile, 1, {key: names[key] for key in (
        "i0", "j0", "rows", "cols")}, c_cs=mc)
    em.line(depth, "}")


def _emit_micro_call(em: "_KernelEmitter", depth: int, kernels: dict[int, str], rows: str,
                     call: str) -> None:
    """The call of the micro-kernel of the strip's height (``rows``, known at run time)."""
    if len(kernels) == 1:
        kernel, = kernels.values()
        em.line(depth, f"{kernel}{call}")
        return
    em.line(depth, f"switch ({rows}) {{")
    for count, kernel in sorted(kernels.items(), reverse=True):
        em.line(depth + 1, f"case {count}: {kernel}{call} break;")
    em.line(depth, "}")


def _emit_pack(em: "_KernelEmitter", s: Gemm, depth: int, copies: int = 1) -> None:
    """Gather B into zero-padded panels of NR columns: ``pack[p][k][q] = B(k, p*NR + q)``,
    B's element (k, j) at ``b_base + walk_k(k) + walk_j(j)`` (each walk over its dims); with
    ``copies`` > 1, one set of panels per batch element, all in one parallel loop."""
    fresh, line = em.names.fresh, em.line
    nr, panels = s.knobs.nr, _panels(s)
    first = panels - 1 if s.b_direct else 0   # read in place: only the partial last panel
    count = panels - first
    t, bt, p, q, kk, j, rest, offsets, src, dst = (fresh(n) for n in (
        "t", "bt", "p", "q", "kk", "j", "rest", "joff", "src", "dst"))

    def panel_body(inner: int) -> None:
        line(inner, f"const long {bt} = {t} / {count}, {p} = {first} + {t} % {count};")
        line(inner, f"(void){bt};")
        with _batch_bindings(em, s if copies > 1 else None, bt, inner):
            _emit_pack_panel(em, s, inner, p, bt, first, (q, kk, j, rest, offsets, src, dst))

    _task_loop(em, depth, copies * count, t, panel_body,
               copies * count * s.k * nr >= PACK_PARALLEL_WORK)


def _tasks_per_claim(s: Gemm, tasks: int, threads: int) -> int:
    """Tasks a thread claims at a time: one, unless a task is smaller than
    ``MIN_CLAIMED_WORK`` multiply-adds (a blocked convolution's output row of 8 pixels is
    18K): then as many as make that much work, while every thread still gets
    ``CLAIMS_PER_THREAD`` claims."""
    work = s.knobs.mc * s.knobs.nc * s.k
    if is_traced(tasks) or is_traced(work) or work >= MIN_CLAIMED_WORK:
        return 1
    return max(1, min(-(-MIN_CLAIMED_WORK // work),
                      tasks // (CLAIMS_PER_THREAD * max(1, threads))))


def _task_loop(em: "_KernelEmitter", depth: int, count: int, index: str,
               body: Callable[[int], None], parallel: bool, chunk: int = 1) -> None:
    """``for index in 0 .. count: body``, on the thread pool when ``parallel``: ``chunk``
    tasks (a block of the product, or a panel to pack) per claim, so that a late or
    preempted thread holds back at most the few tasks it took."""
    if parallel:
        em.parallel(depth, str(count), index, body, chunk=chunk)
        return
    em.line(depth, f"for (long {index} = 0; {index} < {count}; ++{index}) {{")
    body(depth + 1)
    em.line(depth, "}")


def _emit_walk(em: "_KernelEmitter", depth: int, offset: str, rest: str,
               dims: tuple[tuple[int, int], ...]) -> None:
    """C that adds to ``offset`` where the walk of (extent, stride) ``dims`` (outer to inner)
    puts element ``rest``, dividing ``rest`` by the walk's extents (what is left is the
    element's index past the walk: a folded column's batch element)."""
    for extent, stride in reversed(dims):
        em.line(depth, f"{offset} += ({rest} % {extent}) * {stride}; {rest} /= {extent};")


def _walk_offsets(dims: tuple[tuple[int, int], ...]) -> list[int]:
    """The offsets of a walk of (extent, stride) dims, outer to inner, in order."""
    offsets = [0]
    for extent, stride in dims:
        offsets = [o + i * stride for o in offsets for i in range(extent)]
    return offsets


def _emit_pack_panel(em: "_KernelEmitter", s: Gemm, inner: int, p: str, bt: str, first: int,
                     names: tuple[str, ...], in_place_slot: str | None = None) -> None:
    """Pack panel ``p`` of B (see :func:`_emit_pack`); with ``in_place_slot``, a panel that
    is one run of consecutive columns of B is not copied: the slot gets its first column's
    address (its rows are ``koff[k]`` from there) and the other panels get NULL."""
    fresh, line = em.names.fresh, em.line
    nr, count = s.knobs.nr, _panels(s) - first
    q, kk, j, rest, offsets, src, dst = names
    line(inner, f"long {offsets}[{nr}];  /* B offset of each column of the panel, -1: padding */")
    line(inner, f"for (long {q} = 0; {q} < {nr}; ++{q}) {{")
    line(inner + 1, f"const long {j} = {p} * {nr} + {q};")
    line(inner + 1, f"long {rest} = {j}, off = 0;")
    _emit_walk(em, inner + 1, "off", rest, s.b_j_dims)
    if s.knobs.fold_batch:
        # the rest is the column's batch element: B's base moves with it
        line(inner + 1, f"if ({j} < {s.columns}) {{")
        with _batch_bindings(em, s, rest, inner + 2):
            line(inner + 2, f"off += {em.exprs.expr(s.b_base)};")
        line(inner + 1, "}")
    line(inner + 1, f"{offsets}[{q}] = {j} < {s.columns} ? off : -1;")
    line(inner, "}")
    base = "0" if s.knobs.fold_batch else em.exprs.expr(s.b_base)
    line(inner, f"const float *{src} = {em._buffer(s.b)} + ({base});")
    line(inner, f"float *{dst} = {em._buffer(s.pack)} + ({bt} * {count} + {p} - {first}) * "
                f"{s.k * nr};")
    # A panel whose columns are evenly spaced elements of B -- an im2col panel within one
    # output row of a convolution, no padding column: most of them -- is copied with B's
    # column stride known at compile time, which compiles to vector moves (a memcpy of NR
    # floats at stride 1); the others gather per column.
    step = s.b_j_dims[-1][1] if s.b_j_dims else 1
    uniform = fresh("uniform")
    line(inner, f"int {uniform} = {offsets}[0] >= 0;")
    line(inner, f"for (long {q} = 1; {q} < {nr}; ++{q}) "
                f"{uniform} &= {offsets}[{q}] == {offsets}[0] + {q} * {step};")
    if in_place_slot is not None:
        line(inner, f"{in_place_slot} = NULL;")
    line(inner, f"if ({uniform}) {{")
    if in_place_slot is not None and step == 1:
        line(inner + 1, f"{in_place_slot} = {src} + {offsets}[0];")
    else:
        _emit_pack_rows(em, s, inner + 1, (q, kk, offsets, src, dst), step)
    line(inner, "} else {")
    # The other panels are runs of evenly spaced columns (a panel that spans the end of one
    # output row and the start of the next: two runs) and runs of padding; the runs are the
    # same for every row of the panel, so they are found once and each row copies run by run.
    runs, starts, sources = fresh("runs"), fresh("run_at"), fresh("run_from")
    line(inner + 1, f"long {starts}[{nr + 1}], {sources}[{nr}];")
    line(inner + 1, f"long {runs} = 0;")
    line(inner + 1, f"for (long {q} = 0; {q} < {nr}; ++{q}) {{")
    line(inner + 2, f"if ({q} == 0 || ({offsets}[{q}] < 0) != ({offsets}[{q} - 1] < 0) || "
                    f"({offsets}[{q}] >= 0 && {offsets}[{q}] != {offsets}[{q} - 1] + {step})) "
                    f"{{")
    line(inner + 3, f"{starts}[{runs}] = {q}; {sources}[{runs}] = {offsets}[{q}]; ++{runs};")
    line(inner + 2, "}")
    line(inner + 1, "}")
    line(inner + 1, f"{starts}[{runs}] = {nr};")
    _emit_pack_runs(em, s, inner + 1, (kk, src, dst, runs, starts, sources), step)
    line(inner, "}")


def _open_reduction_loops(em: "_KernelEmitter", s: Gemm, inner: int, kk: str
                          ) -> tuple[int, str]:
    """Open the loops over B's reduction dims (``kk`` counts the panel rows written) and
    return the depth of their body and the C offset of the current reduction step in B."""
    em.line(inner, f"long {kk} = 0;")
    k_vars = [em.names.fresh("k") for _ in s.b_k_dims]
    for level, (var, (extent, _)) in enumerate(zip(k_vars, s.b_k_dims)):
        em.line(inner + level, f"for (long {var} = 0; {var} < {extent}; ++{var}) {{")
    offset = " + ".join(f"{var} * {stride}" for var, (_, stride) in zip(k_vars, s.b_k_dims))
    return inner + len(k_vars), offset


def _close_reduction_loops(em: "_KernelEmitter", inner: int, body: int, kk: str) -> None:
    """Count the panel row written and close the loops :func:`_open_reduction_loops` opened."""
    em.line(body, f"++{kk};")
    for level in range(body - 1, inner - 1, -1):
        em.line(level, "}")


def _emit_pack_rows(em: "_KernelEmitter", s: Gemm, inner: int, names: tuple[str, ...],
                    step: int) -> None:
    """The loops over B's reduction dims copying one panel row per step: NR floats ``step``
    apart from the first column's offset (a panel that is one run)."""
    fresh, line = em.names.fresh, em.line
    nr = s.knobs.nr
    q, kk, offsets, src, dst = names
    body, k_offset = _open_reduction_loops(em, s, inner, kk)
    line(body, f"const float *row = {src} + {k_offset};")
    lanes = s.knobs.lanes
    if step == 1 and nr % lanes == 0:
        # whole vectors (GCC expanded a memcpy of the 64-byte row into four 16-byte moves)
        vector = unaligned_vector_type(em.ctx.helpers, lanes)
        for q_at in range(0, nr, lanes):
            line(body, f"*({vector} *)({dst} + {kk} * {nr} + {q_at}) = "
                       f"*(const {vector} *)(row + {offsets}[0] + {q_at});")
    else:
        line(body, f"for (long {q} = 0; {q} < {nr}; ++{q})")
        line(body + 1, f"{dst}[{kk} * {nr} + {q}] = row[{offsets}[0] + {q} * {step}];")
    _close_reduction_loops(em, inner, body, kk)


def _emit_pack_runs(em: "_KernelEmitter", s: Gemm, inner: int, names: tuple[str, ...],
                    step: int) -> None:
    """The loops over B's reduction dims copying one panel row per step, run by run: a run
    of padding is zeros, any other run copies its columns ``step`` apart in B."""
    fresh, line = em.names.fresh, em.line
    nr = s.knobs.nr
    kk, src, dst, runs, starts, sources = names
    body, k_offset = _open_reduction_loops(em, s, inner, kk)
    r, q = fresh("r"), fresh("q")
    to, start, length = fresh("to"), fresh("from"), fresh("length")
    line(body, f"const float *row = {src} + {k_offset};")
    line(body, f"for (long {r} = 0; {r} < {runs}; ++{r}) {{")
    line(body + 1, f"float *{to} = {dst} + {kk} * {nr} + {starts}[{r}];")
    line(body + 1, f"const long {length} = {starts}[{r} + 1] - {starts}[{r}];")
    line(body + 1, f"if ({sources}[{r}] < 0) {{")
    line(body + 2, f"for (long {q} = 0; {q} < {length}; ++{q}) {to}[{q}] = 0.0f;")
    line(body + 1, "} else {")
    line(body + 2, f"const float *{start} = row + {sources}[{r}];")
    if step == 1:
        line(body + 2, f"{copy_floats(em.ctx.helpers)}({to}, {start}, {length});")
    else:
        line(body + 2, f"for (long {q} = 0; {q} < {length}; ++{q}) "
                       f"{to}[{q}] = {start}[{q} * {step}];")
    line(body + 1, "}")
    line(body, "}")
    _close_reduction_loops(em, inner, body, kk)


def copy_floats(helpers: HelperSet) -> str:
    """``ember_copy_floats(to, from, n)``: n consecutive floats copied by whole vector moves
    of 16, 8 or 4 floats, the last one ending where the run does (overlapping the one before
    it) -- a panel's runs are as short as an image row (14 floats at 14x14), which a loop of
    variable length copies one float at a time: packing the panels of a grouped convolution
    over 14x14 cost several times its multiply-adds.  No move leaves the run."""
    name = "ember_copy_floats"
    return helpers.need(name, lambda: "\n".join([
        f"static inline void {name}(float *restrict to, const float *restrict from, long n) {{",
        "  if (n >= 16) {",
        "    long i = 0;",
        "    for (; i + 16 <= n; i += 16) __builtin_memcpy(to + i, from + i, 64);",
        "    if (i < n) __builtin_memcpy(to + n - 16, from + n - 16, 64);",
        "  } else if (n >= 8) {",
        "    __builtin_memcpy(to, from, 32);",
        "    __builtin_memcpy(to + n - 8, from + n - 8, 32);",
        "  } else if (n >= 4) {",
        "    __builtin_memcpy(to, from, 16);",
        "    __builtin_memcpy(to + n - 4, from + n - 4, 16);",
        "  } else {",
        "    for (long i = 0; i < n; ++i) to[i] = from[i];",
        "  }",
        "}"]))


@contextmanager
def _batch_bindings(em: "_KernelEmitter", s: Gemm | None, linear: str,
                    depth: int) -> Iterator[None]:
    """Bind the batch variables of ``s`` to C names decoded from the linear index ``linear``
    (outermost varies slowest) for the duration of a ``with`` block; with ``s`` None, bind
    nothing (B shared by the whole batch)."""
    from ember.codegen.c import _Binding

    with ExitStack() as scope:
        if s is not None:
            stride, decoded = 1, []
            for var, extent in reversed(s.batch):
                decoded.append((var, f"({linear} / {stride}) % {extent}"))
                stride *= extent
            for var, value in reversed(decoded):
                name = scope.enter_context(_Binding(em.vars, var, em.names.fresh(var.name)))
                em.line(depth, f"const long {name} = {value}; (void){name};")
        yield


def _emit_epilogue(em: "_KernelEmitter", s: Gemm, depth: int, names: dict[str, str],
                   scratch: tuple[str, int, int] | None = None,
                   one_vector: bool = False) -> None:
    """The fused epilogue on a finished tile, ``t = finish(t)`` over rows x cols: the tile
    where it was stored in the output, or, with ``scratch`` (its C pointer, row stride and
    column stride), where it lies in the task's scratch (a product whose batch is not
    folded: its epilogue does not change along a row).  The inner loop runs along the
    tile's consecutive elements; with ``one_vector`` (``cols`` is the vector width) it is
    one vector operation per row, which the C compiler is kept from unrolling first (GCC then
    vectorized the row loop around it, through transposes: a blocked 1x1 convolution's
    bias took half its time)."""
    from ember.codegen.c import _Binding

    i0, j0, rows, cols = (Var(f"gemm_{n}", INDEX) for n in ("i0", "j0", "rows", "cols"))
    r, c = Var("gemm_r", INDEX), Var("gemm_c", INDEX)
    row, col = i0 + r, j0 + c
    by_columns = False
    if scratch is None:
        tile, index = s.out, s.out_base + row * s.out_rs + col
    else:
        tile = Buffer("gemm_tile", s.out.dtype, (1,), scope="global", align=4)
        index = r * scratch[1] + c * scratch[2]
        by_columns = scratch[2] != 1
    value = substitute(s.finish, {s.row: row, s.col: col, s.result: Load(tile, index)})
    if by_columns:
        loop = For(c, _zero(), cols, ForKind.SERIAL,
                   For(r, _zero(), rows, ForKind.VECTORIZED, Store(tile, index, value)))
    else:
        keep = (("unroll", 1),) if one_vector else ()
        loop = For(r, _zero(), rows, ForKind.SERIAL,
                   For(c, _zero(), cols, ForKind.VECTORIZED, Store(tile, index, value),
                       annotations=keep))
    # (A constant-width loop for full tiles was tried: GCC then made the Relu/Clip epilogues
    # of ResNet-18's convolutions slower, 34 -> 48 ms for the model.)
    with ExitStack() as scope:
        for var, key in ((i0, "i0"), (j0, "j0"), (rows, "rows"), (cols, "cols")):
            scope.enter_context(_Binding(em.vars, var, names[key]))
        if scratch is not None:
            scope.enter_context(_Binding(em.buffers, tile, scratch[0]))
        em.stmt(loop, depth)


def _emit_run_epilogue(em: "_KernelEmitter", s: Gemm, depth: int, tile: str, c_rs: int,
                       names: dict[str, str], c_cs: int = 1) -> None:
    """Store a finished tile, accumulated in the task's scratch (element (r, c) at
    ``r * c_rs + c * c_cs``), run by run (through ``finish`` when there is one): with the
    batch folded into the columns, a run ends where a batch element's columns do and goes
    to that element's output; with the output in runs (``out_j_dims``), a run ends where a
    run of the output does and goes where the walk puts its first column."""
    from ember.codegen.c import _Binding

    fresh, line = em.names.fresh, em.line
    i0, j0, rows, cols = (names[key] for key in ("i0", "j0", "rows", "cols"))
    r, c0, e, jj, length, at, out_at = (fresh(n) for n in ("r", "c0", "e", "jj", "length",
                                                            "from", "out_at"))
    fold = s.knobs.fold_batch
    finish = s.finish
    if finish is not None and not fold:
        # the epilogue first, on the tile where it lies in the scratch: whole rows of
        # consecutive columns, which vectorize (run by run, a row is a few short pieces)
        _emit_epilogue(em, s, depth, names, scratch=(tile, c_rs, c_cs))
        finish = None
    line(depth, f"for (long {r} = 0; {r} < {rows}; ++{r}) {{")
    line(depth + 1, f"for (long {c0} = 0; {c0} < {cols};) {{  /* run by run */")
    inner = depth + 2
    if fold:
        line(inner, f"const long {e} = ({j0} + {c0}) / {s.n}, {jj} = ({j0} + {c0}) % {s.n};")
        line(inner, f"long {length} = {s.n} - {jj} < {cols} - {c0} ? {s.n} - {jj} : "
                    f"{cols} - {c0};")
    else:
        line(inner, f"const long {jj} = {j0} + {c0};")
        line(inner, f"long {length} = {cols} - {c0};")
    if s.out_in_runs:
        width = s.out_j_dims[-1][0]
        line(inner, f"if ({width} - {jj} % {width} < {length}) "
                    f"{length} = {width} - {jj} % {width};")
        rest = fresh("rest")
        line(inner, f"long {out_at} = 0, {rest} = {jj};")
        _emit_walk(em, inner, out_at, rest, s.out_j_dims)
    else:
        line(inner, f"const long {out_at} = {jj};")
    line(inner, f"const float *{at} = {tile} + {r} * {c_rs} + {c0} * {c_cs};")
    row_var, start, count, place = (Var(f"gemm_{n}", INDEX)
                                    for n in ("row", "j", "length", "out_at"))
    c = Var("gemm_c", INDEX)
    run = Buffer("gemm_run", s.out.dtype, (s.knobs.nr * c_cs,), scope="global", align=4)
    index = s.out_base + row_var * s.out_rs + place + c
    value: Expr = Load(run, c * c_cs)
    if finish is not None:
        value = substitute(finish, {s.row: row_var, s.col: start + c, s.result: value})
    loop = For(c, _zero(), count, ForKind.VECTORIZED, Store(s.out, index, value))
    with ExitStack() as scope:
        if fold:
            scope.enter_context(_batch_bindings(em, s, e, inner))
        row_name = fresh("row")
        line(inner, f"const long {row_name} = {i0} + {r};")
        for var, name in ((row_var, row_name), (start, jj), (count, length), (place, out_at)):
            scope.enter_context(_Binding(em.vars, var, name))
        scope.enter_context(_Binding(em.buffers, run, at))
        if finish is None and c_cs == 1:  # a plain copy of the piece
            destination = em.exprs.expr(simplify(s.out_base + row_var * s.out_rs + place))
            line(inner, f"memcpy({em._buffer(s.out)} + ({destination}), {at}, "
                        f"{length} * sizeof(float));")
        else:
            em.stmt(loop, inner)
    line(inner, f"{c0} += {length};")
    line(depth + 1, "}")
    line(depth, "}")


def _zero() -> Const:
    return Const(0, INDEX)


def gemm_buffers(s: Gemm) -> tuple[set[Buffer], set[Buffer]]:
    """(read, written) buffers of ``s``."""
    written = {s.out} | ({s.pack} if s.pack is not None else set())
    return {s.a, s.b, s.out}, written
