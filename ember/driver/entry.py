"""The C entry point of a compiled model: ``ember_run`` runs every step in order.

A step is a kernel -- one fused group of nodes -- or a host call of one node's numpy reference
(a fallback).  Storage of each value is fixed at compile time: graph inputs and outputs are
the caller's pointers, constants live at offsets in the weights blob, intermediates (and each
kernel's scratch) at offsets in the workspace arena.  Host calls go through the ``host``
callback with an array of buffer pointers: their inputs, then their outputs.

``ember_run`` returns 0 on success; otherwise :func:`status_code` of the failing step and the
reason (:data:`STATUS_HOST_FAILED`, :data:`STATUS_INDEX_OUT_OF_RANGE`), which the runtime turns
into an error naming the node.  Kernels whose loads are addressed by run-time data (Gather's
indices) declare the valid range of those inputs; the entry point checks them before calling
the kernel.

The library also describes itself: ``ember_signature()`` returns a JSON text of the input,
output and fallback-node buffers (dtypes and shapes), of the workspace and weights sizes and
of the offset, dtype and shape of every constant it reads from the weights blob,
so that a loader can refuse a manifest that does not match the code.  It holds numbers and
dtype names only: no text from the model reaches the generated source except through
:mod:`ember.codegen.c_names` (node names appear in comments, sanitized by ``c_comment``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ember.codegen.c_names import c_comment
from ember.codegen.c_types import storage_ctype
from ember.core.dtypes import DType
from ember.ir.graph import Graph
from ember.ir.types import TensorType
from ember.runtime.manifest import IndexCheck  # the artifact's record of a range check

# Version of the calling convention of ``ember_run`` and ``ember_signature``.
ABI_VERSION = 1

STATUS_HOST_FAILED = 1
STATUS_INDEX_OUT_OF_RANGE = 2


def status_code(node_index: int, reason: int) -> int:
    """The ``ember_run`` return value for ``reason`` at step ``node_index`` (never 0)."""
    return node_index * 256 + reason


HEADER = """
#include <stdint.h>
#include <string.h>

typedef int32_t (*ember_host_fn)(void *ctx, int32_t node_index, void **buffers);
"""  # EMBER_EXPORT (default visibility) is defined by the codegen prelude


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


def tensor_spec(vtype: TensorType) -> dict[str, Any]:
    """A buffer as the signature and the manifest describe it: dtype name and static shape."""
    return {"dtype": vtype.dtype.numpy.name, "shape": [int(d) for d in vtype.shape]}


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
            "outputs": specs(list(g.outputs)), "workspace_size": int(workspace_size),
            "weights_size": int(weights_size), "weights": weights, "host_nodes": host_nodes}


# A signature is numbers, dtype names and JSON punctuation; nothing that could end a C string.
_SIGNATURE_CHARS = re.compile(r'[A-Za-z0-9_{}\[\]":, -]*\Z')


def _signature_literal(value: dict[str, Any]) -> str:
    text = json.dumps(value, separators=(",", ":"))
    if not _SIGNATURE_CHARS.match(text):
        raise ValueError(f"signature holds characters a C string cannot take verbatim: {text!r}")
    return '"' + text.replace('"', '\\"') + '"'


_RANGE_CHECK = """
/* 1 if some of the n values at p lie outside [lo, hi): a branch-free scan that vectorizes. */
static int em_out_of_range_{tag}(const {ctype} *p, int64_t n, int64_t lo, int64_t hi)
{{
  int bad = 0;
  for (int64_t i = 0; i < n; ++i)
    bad |= {test};
  return bad;
}}
"""


def _range_check_helper(dtype: DType) -> str:
    ctype = storage_ctype(dtype)
    if dtype == DType.UINT64:  # never below lo <= 0; compare unsigned to stay exact
        test = "p[i] >= (uint64_t)hi"
    else:
        test = "((int64_t)p[i] < lo) | ((int64_t)p[i] >= hi)"
    return _RANGE_CHECK.format(tag=dtype.numpy.name, ctype=ctype, test=test)


def generate_entry(g: Graph, steps: list[EntryStep], weight_offsets: dict[str, int],
                   workspace_offsets: dict[str, int], workspace_size: int,
                   weights_size: int = 0) -> str:
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
    checked_dtypes = sorted({g.types[c.input].dtype for s in steps for c in s.index_checks},
                            key=lambda d: d.numpy.name)
    lines = [HEADER,
             *(_range_check_helper(d) for d in checked_dtypes),
             "EMBER_EXPORT int64_t ember_workspace_size(void)",
             f"{{ return {workspace_size}; }}",
             "",
             "EMBER_EXPORT const char *ember_signature(void)",
             f"{{ return {_signature_literal(described)}; }}",
             "",
             "EMBER_EXPORT int32_t ember_run(void *const *inputs, void *const *outputs, "
             "const uint8_t *weights, uint8_t *workspace, ember_host_fn host, void *host_ctx)",
             "{",
             "  (void)inputs; (void)outputs; (void)weights; (void)workspace;",
             "  (void)host; (void)host_ctx;"]
    for step in steps:
        lines.append(f"  /* step {step.index}: {c_comment(step.label)} */")
        for check in step.index_checks:
            vtype = g.types[check.input]
            count = vtype.nbytes // vtype.dtype.itemsize
            lines.append(f"  if (em_out_of_range_{vtype.dtype.numpy.name}("
                         f"(const {storage_ctype(vtype.dtype)} *){pointer(check.input)}, "
                         f"{count}, INT64_C({check.low}), INT64_C({check.high})))")
            lines.append(f"    return {status_code(step.index, STATUS_INDEX_OUT_OF_RANGE)};")
        args = [pointer(n) for n in step.reads] + [pointer(n) for n in step.writes]
        args += [f"(void *)(workspace + {offset})" for offset in step.scratch_offsets]
        if step.kind == "kernel":
            lines.append(f"  {step.kernel_name}({', '.join(args)});")
        else:
            buffers = ", ".join(args) if args else "0"
            lines.append("  {")
            lines.append(f"    void *buffers[{max(len(args), 1)}] = {{{buffers}}};")
            lines.append(f"    if (host(host_ctx, {step.index}, buffers) != 0)")
            lines.append(f"      return {status_code(step.index, STATUS_HOST_FAILED)};")
            lines.append("  }")
    # Outputs that no node writes (an input or constant passed through, or a repeated name).
    for j, name in enumerate(g.outputs):
        if name in produced and output_index[name] == j:
            continue
        source = pointer(name) if name not in produced else f"outputs[{output_index[name]}]"
        vtype = g.types[name]
        lines.append(f"  memcpy(outputs[{j}], {source}, {vtype.nbytes});")
    lines.append("  return 0;")
    lines.append("}")
    return "\n".join(lines) + "\n"
