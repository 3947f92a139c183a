"""The C entry point of a compiled model: ``ember_run`` runs every step in order.

A step is a kernel -- one fused group of nodes -- or a host call of one node's numpy reference
(a fallback).  Storage of each value is fixed at compile time: graph inputs and outputs are
the caller's pointers, constants live at offsets in the weights blob, intermediates (and each
kernel's scratch) at offsets in the workspace arena.  Host calls go through the ``host``
callback with an array of buffer pointers: their inputs, then their outputs.

``ember_run`` returns 0 on success; otherwise :func:`status_code` of the failing step and the
reason (:data:`STATUS_HOST_FAILED`, :data:`STATUS_INDEX_OUT_OF_RANGE`,
:data:`STATUS_EXCLUDED_VALUE`), which the runtime turns into an error naming the node.
Kernels whose loads are addressed by run-time data (Gather's indices) declare the valid range
of those inputs, and integer Div/Mod declare that their divisor holds no 0 (an ``outside``
check: C leaves the division undefined, ONNX Runtime fails); the entry point checks them
before calling the kernel.

``ember_run_profiled`` takes the same arguments plus ``double *step_seconds``, one slot per
step, and runs the same steps, writing each step's wall time (``CLOCK_MONOTONIC``) into its
slot: the per-kernel profiler (``ember profile``) reads it.  Both functions are generated
from the same lines of each step, so they cannot drift apart; ``ember_run`` itself carries
no timing code.  A library whose platform has no monotonic clock (wasm) omits the profiled
entry point, and the runtime says profiling is not supported.

The library also describes itself: ``ember_signature()`` returns a JSON text of the input,
output and fallback-node buffers (dtypes and shapes), of the workspace and weights sizes, of
the offset, dtype and shape of every constant it reads from the weights blob and of the
number of steps (the length of ``step_seconds``) and of the alignment it needs of input
pointers (``input_alignment``), so that a loader can refuse a manifest
that does not match the code.  It holds numbers and
dtype names only: no text from the model reaches the generated source except through
:mod:`ember.codegen.c_names` (node names appear in comments, sanitized by ``c_comment``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ember.codegen.c_names import c_comment
from ember.codegen.c_types import storage_ctype
from ember.core.dtypes import DType
from ember.core.traced import C_HELPERS as TRACED_SIZE_HELPERS, DIMS_ARRAY, is_traced, plain
from ember.ir.graph import Graph
from ember.ir.types import TensorType
from ember.runtime.manifest import IndexCheck  # the artifact's record of a range check

# Version of the calling convention of ``ember_run`` and ``ember_signature``.
ABI_VERSION = 1

STATUS_HOST_FAILED = 1
STATUS_INDEX_OUT_OF_RANGE = 2
STATUS_EXCLUDED_VALUE = 3

# The alignment, in bytes, that the library's code assumes of an input pointer beyond the
# alignment of its element type (1: none).  Kernels promise 64-byte alignment of workspace
# and weights only (see ``pipeline._element_aligned_inputs``), so a caller's array is read
# where it lies.
INPUT_ALIGNMENT = 1


def status_code(node_index: int, reason: int) -> int:
    """The ``ember_run`` return value for ``reason`` at step ``node_index`` (never 0)."""
    return node_index * 256 + reason


HEADER = """
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef int32_t (*ember_host_fn)(void *ctx, int32_t node_index, void **buffers);
"""  # EMBER_EXPORT (default visibility) is defined by the codegen prelude

# The clock of ember_run_profiled.  The library is compiled as strict C11 (-std=c11), where
# glibc's and musl's <time.h> hide POSIX's clock_gettime; on Linux its type is fixed by the
# kernel ABI (clockid_t is int, CLOCK_MONOTONIC is 1), so it is declared here.  Platforms that
# show it (macOS) use their own declaration; others (wasm) get no profiled entry point.
PROFILING_CLOCK = """
#if defined(CLOCK_MONOTONIC)
#define EM_PROFILING 1
#define EM_CLOCK_MONOTONIC CLOCK_MONOTONIC
#elif defined(__linux__)
#define EM_PROFILING 1
#define EM_CLOCK_MONOTONIC 1
int clock_gettime(int clock_id, struct timespec *now);
#endif

#ifdef EM_PROFILING
/* Seconds since *since; *since becomes now, so consecutive steps share their boundaries and
   the step times add up to the whole run. */
static double em_lap(struct timespec *since)
{
  struct timespec now;
  if (clock_gettime(EM_CLOCK_MONOTONIC, &now) != 0)
    now = *since;
  const double seconds = (double)(now.tv_sec - since->tv_sec)
                         + (double)(now.tv_nsec - since->tv_nsec) * 1e-9;
  *since = now;
  return seconds;
}
#endif
"""

RUN_PARAMETERS = ("void *const *inputs, void *const *outputs, const uint8_t *weights, "
                  "uint8_t *workspace, ember_host_fn host, void *host_ctx")


@dataclass
class EntryStep:
    """One call of ``ember_run``: a kernel (a fused group) or a host call (one node).

    The call passes ``reads`` then ``writes`` (value names, placed by the memory plan), then
    for a kernel its scratch buffers (workspace offsets).  ``label`` says what the step
    computes, for a comment in the source (sanitized there)."""

    index: int
    kind: str  # "kernel" | "host"
    kernel_name: str | None
    reads: list[str]
    writes: list[str]
    label: str = ""
    scratch_offsets: list[int] = field(default_factory=list)
    index_checks: list[IndexCheck] = field(default_factory=list)
    # the kernel takes the run-time dims array as its last argument (a traced build)
    runtime_dims: bool = False


def tensor_spec(vtype: TensorType) -> dict[str, Any]:
    """A buffer as the signature and the manifest describe it: dtype name and static shape."""
    # a traced build's signature describes its sample (the run-time shapes come from the dims)
    return {"dtype": vtype.dtype.numpy.name, "shape": [plain(d) for d in vtype.shape]}


def signature(g: Graph, steps: list[EntryStep], workspace_size: int, weights_size: int,
              weight_offsets: dict[str, int]) -> dict[str, Any]:
    """What ``ember_signature()`` returns (parsed): the buffers the library reads and writes,
    and where in the weights blob it reads each constant (in offset order)."""
    def specs(names: list[str]) -> list[dict[str, Any]]:
        return [tensor_spec(g.types[n]) for n in names]

    weights = [{"offset": int(offset), **tensor_spec(g.types[name])}
               for name, offset in sorted(weight_offsets.items(), key=lambda item: item[1])]

    host_nodes = [{"index": step.index, "inputs": specs(step.reads),
                   "outputs": specs(step.writes)}
                  for step in steps if step.kind == "host"]
    return {"abi": ABI_VERSION, "inputs": specs(list(g.inputs)),
            "outputs": specs(list(g.outputs)), "workspace_size": plain(workspace_size),
            "weights_size": int(weights_size), "weights": weights, "host_nodes": host_nodes,
            "steps": len(steps), "input_alignment": INPUT_ALIGNMENT}


# A signature is numbers, dtype names and JSON punctuation; nothing that could end a C string.
_SIGNATURE_CHARS = re.compile(r'[A-Za-z0-9_{}\[\]":, -]*\Z')


def _signature_literal(value: dict[str, Any]) -> str:
    text = json.dumps(value, separators=(",", ":"))
    if not _SIGNATURE_CHARS.match(text):
        raise ValueError(f"signature holds characters a C string cannot take verbatim: {text!r}")
    return '"' + text.replace('"', '\\"') + '"'


_SCAN = """
/* 1 if some of every stride-th of the n values at p {meaning}: a branch-free scan (stride 1,
   all values, is the loop that vectorizes). */
static int {name}_{tag}(const {ctype} *p, int64_t n, int64_t stride, int64_t lo, int64_t hi)
{{
  int bad = 0;
  if (stride == 1) {{
    for (int64_t i = 0; i < n; ++i)
      bad |= {test};
  }} else {{
    for (int64_t i = 0; i < n; i += stride)
      bad |= {test};
  }}
  return bad;
}}
"""


def _range_check_helper(dtype: DType) -> str:
    if dtype == DType.UINT64:  # never below lo <= 0; compare unsigned to stay exact
        test = "p[i] >= (uint64_t)hi"
    else:
        test = "((int64_t)p[i] < lo) | ((int64_t)p[i] >= hi)"
    return _SCAN.format(name="em_out_of_range", meaning="lies outside [lo, hi)",
                        tag=dtype.numpy.name, ctype=storage_ctype(dtype), test=test)


def _excluded_check_helper(dtype: DType) -> str:
    if dtype.is_signed:
        test = "((int64_t)p[i] >= lo) & ((int64_t)p[i] < hi)"
    else:  # compared as uint64, exact for every unsigned type; the checks give lo >= 0
        test = "((uint64_t)p[i] >= (uint64_t)lo) & ((uint64_t)p[i] < (uint64_t)hi)"
    return _SCAN.format(name="em_holds",
                        meaning="lies in [lo, hi) (lo >= 0 for unsigned types; [0, 1) checks "
                                "an integer divisor)",
                        tag=dtype.numpy.name, ctype=storage_ctype(dtype), test=test)


def generate_entry(g: Graph, steps: list[EntryStep], weight_offsets: dict[str, int],
                   workspace_offsets: dict[str, int], workspace_size: int,
                   weights_size: int = 0, runtime_dims: int = 0) -> str:
    """The C of ``ember_run``, ``ember_run_profiled``, ``ember_workspace_size`` and
    ``ember_signature`` for ``steps`` (in order; step ``k`` has index ``k``, which is also
    its slot in ``step_seconds``).

    ``runtime_dims`` > 0: a build traced over that many run-time dims
    (``ember.core.traced``).  ``ember_run`` reads them as ``const int64_t em_dims[]`` from
    the slot after the last input pointer and passes them to every kernel as its last
    argument; sizes and offsets are expressions of them.  ``ember_workspace_size`` and the
    signature give the sizes of the traced sample: the caller computes the workspace of a
    call from the dims."""
    for position, step in enumerate(steps):
        if step.index != position:
            raise ValueError(f"step {position} has index {step.index}; steps must be numbered "
                             f"in order from 0 (the index is the step's timing slot)")
    output_index: dict[str, int] = {}
    for j, name in enumerate(g.outputs):
        output_index.setdefault(name, j)
    produced = {o for step in steps for o in step.writes}

    def pointer(name: str) -> str:
        if name in output_index and name in produced:
            return f"outputs[{output_index[name]}]"
        if name in g.inputs:
            return f"inputs[{g.inputs.index(name)}]"
        if name in weight_offsets:
            return f"(void *)(weights + {weight_offsets[name]})"
        if name in workspace_offsets:
            return f"(void *)(workspace + {workspace_offsets[name]})"
        raise KeyError(f"value '{name}' has no storage")

    described = signature(g, steps, workspace_size, weights_size, weight_offsets)
    checked_dtypes = sorted({g.types[c.input].dtype for s in steps for c in s.index_checks
                             if not c.outside}, key=lambda d: d.numpy.name)
    excluded_dtypes = sorted({g.types[c.input].dtype for s in steps for c in s.index_checks
                              if c.outside}, key=lambda d: d.numpy.name)
    # The C of each step, generated once: both entry points are made of these very lines.
    step_code = [_step_lines(g, step, pointer) for step in steps]
    tail = _passthrough_lines(g, produced, output_index, pointer)
    unused = ["  (void)inputs; (void)outputs; (void)weights; (void)workspace;",
              "  (void)host; (void)host_ctx;"]
    if runtime_dims:
        unused.append(f"  const int64_t *{DIMS_ARRAY} = (const int64_t *)inputs[{len(g.inputs)}];"
                      f" (void){DIMS_ARRAY};")

    lines = [HEADER,
             *([TRACED_SIZE_HELPERS] if runtime_dims else []),
             *(_range_check_helper(d) for d in checked_dtypes),
             *(_excluded_check_helper(d) for d in excluded_dtypes),
             "EMBER_EXPORT int64_t ember_workspace_size(void)",
             f"{{ return {plain(workspace_size)}; }}",
             "",
             "EMBER_EXPORT const char *ember_signature(void)",
             f"{{ return {_signature_literal(described)}; }}",
             "",
             f"EMBER_EXPORT int32_t ember_run({RUN_PARAMETERS})",
             "{",
             *unused]
    for code in step_code:
        lines.extend(code)
    lines += [*tail, "  return 0;", "}", PROFILING_CLOCK,
              "#ifdef EM_PROFILING",
              "/* ember_run, writing the wall time of step k to step_seconds[k]. */",
              f"EMBER_EXPORT int32_t ember_run_profiled({RUN_PARAMETERS}, "
              f"double *step_seconds)",
              "{",
              *unused,
              "  (void)step_seconds;",
              "  struct timespec em_clock;",
              "  if (clock_gettime(EM_CLOCK_MONOTONIC, &em_clock) != 0)",
              "    memset(&em_clock, 0, sizeof em_clock);"]
    for step, code in zip(steps, step_code):
        lines.extend(code)
        lines.append(f"  step_seconds[{step.index}] = em_lap(&em_clock);")
    lines += [*tail, "  return 0;", "}", "#endif"]
    return "\n".join(lines) + "\n"


def _c_int64(value: int) -> str:
    """An int64 constant in C, or the expression of a size a traced build takes at run time."""
    return f"((int64_t){value})" if is_traced(value) else f"INT64_C({value})"


def _step_lines(g: Graph, step: EntryStep, pointer: Callable[[str], str]) -> list[str]:
    """The C statements of one step: its range checks, then the kernel call or host call."""
    lines = [f"  /* step {step.index}: {c_comment(step.label)} */"]
    for check in step.index_checks:
        vtype = g.types[check.input]
        count = vtype.nbytes // vtype.dtype.itemsize
        values = f"(const {storage_ctype(vtype.dtype)} *){pointer(check.input)}"
        if check.start:
            values = f"({values} + {check.start})"
        test, reason = ("em_holds", STATUS_EXCLUDED_VALUE) if check.outside else \
            ("em_out_of_range", STATUS_INDEX_OUT_OF_RANGE)
        lines.append(f"  if ({test}_{vtype.dtype.numpy.name}("
                     f"{values}, {_c_int64(count - check.start)}, INT64_C({check.stride}), "
                     f"{_c_int64(check.low)}, {_c_int64(check.high)}))")
        lines.append(f"    return {status_code(step.index, reason)};")
    args = [pointer(n) for n in step.reads] + [pointer(n) for n in step.writes]
    args += [f"(void *)(workspace + {offset})" for offset in step.scratch_offsets]
    if step.kind == "kernel" and step.runtime_dims:
        args.append(DIMS_ARRAY)
    if step.kind == "kernel":
        lines.append(f"  {step.kernel_name}({', '.join(args)});")
    else:
        buffers = ", ".join(args) if args else "0"
        lines.append("  {")
        lines.append(f"    void *buffers[{max(len(args), 1)}] = {{{buffers}}};")
        lines.append(f"    if (host(host_ctx, {step.index}, buffers) != 0)")
        lines.append(f"      return {status_code(step.index, STATUS_HOST_FAILED)};")
        lines.append("  }")
    return lines


def _passthrough_lines(g: Graph, produced: set[str], output_index: dict[str, int],
                       pointer: Callable[[str], str]) -> list[str]:
    """Copies of the outputs that no node writes (an input or constant passed through, or a
    repeated name)."""
    lines = []
    for j, name in enumerate(g.outputs):
        if name in produced and output_index[name] == j:
            continue
        source = pointer(name) if name not in produced else f"outputs[{output_index[name]}]"
        vtype = g.types[name]
        lines.append(f"  memcpy(outputs[{j}], {source}, {vtype.nbytes});")
    return lines
