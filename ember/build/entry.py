"""The C entry point of a compiled model: ``ember_run`` calls every node in order.

Storage of each value is fixed at compile time: graph inputs and outputs are the caller's
pointers, constants live at offsets in the weights blob, intermediates at offsets in the
workspace arena.  Host nodes (numpy fallbacks) are called through the ``host`` callback with an
array of buffer pointers: their inputs, then their outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.ir.graph import Graph, Node

HEADER = """
#include <stdint.h>
#include <string.h>

typedef int32_t (*ember_host_fn)(void *ctx, int32_t node_index, void **buffers);
"""  # EMBER_EXPORT (default visibility) is defined by the codegen prelude


@dataclass
class EntryStep:
    index: int
    node: Node
    kind: str  # "kernel" | "host"
    kernel_name: str | None



def generate_entry(g: Graph, steps: list[EntryStep], weight_offsets: dict[str, int],
                   workspace_offsets: dict[str, int], workspace_size: int) -> str:
    output_index: dict[str, int] = {}
    for j, name in enumerate(g.outputs):
        output_index.setdefault(name, j)
    produced = {o for n in g.nodes for o in n.outputs if o}

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

    lines = [HEADER,
             "EMBER_EXPORT int64_t ember_workspace_size(void)",
             f"{{ return {workspace_size}; }}",
             "",
             "EMBER_EXPORT int32_t ember_run(void *const *inputs, void *const *outputs, "
             "const uint8_t *weights, uint8_t *workspace, ember_host_fn host, void *host_ctx)",
             "{",
             "  (void)inputs; (void)outputs; (void)weights; (void)workspace;",
             "  (void)host; (void)host_ctx;"]
    for step in steps:
        node = step.node
        lines.append(f"  /* node {step.index}: {node.op} '{_comment(node.name)}' */")
        reads = [n for n in node.inputs if n] + node.implicit_inputs()
        args = [pointer(n) for n in reads] + [pointer(n) for n in node.outputs if n]
        if step.kind == "kernel":
            lines.append(f"  {step.kernel_name}({', '.join(args)});")
        else:
            buffers = ", ".join(args) if args else "0"
            lines.append("  {")
            lines.append(f"    void *buffers[{max(len(args), 1)}] = {{{buffers}}};")
            lines.append(f"    int32_t status = host(host_ctx, {step.index}, buffers);")
            lines.append("    if (status != 0) return status;")
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


def _comment(text: str) -> str:
    return text.replace("*/", "* /")
