"""Horizontal fusion: sibling linear ops reading the same input become one, then a Split.

Attention computes its queries, keys and values as three projections of the same input
(``x @ Wq + bq``, ``x @ Wk + bk``, ``x @ Wv + bv``); an Inception block or a detection head
applies several 1x1 convolutions to one feature map.  Each sibling streams the whole input
through its own kernel.  With constant weights they are one product over the weights
concatenated along the output channels, followed by a Split of the result::

    %q = MatMul(%x, %wq)                       %qkv = MatMul(%x, %w_qkv)
    %k = MatMul(%x, %wk)             ->        %qkv_b = Add(%qkv, %b_qkv)
    %v = MatMul(%x, %wv)                       %q, %k, %v = Split(%qkv_b, [n_q, n_k, n_v])
    (+ their bias Adds)

so a single GEMM kernel reads the input once, with a wider (better vectorized) output tile.
Every output column is the same dot product as before, so the result is exactly the same
computation.

Siblings are grouped by op and everything that must agree: for MatMul the weights' dtype and
inner dim (x the left operand, weights constant 2-D); for Gemm also ``transA``, ``transB``,
``alpha`` and ``beta`` (constant or absent ``C``, per column or full, absent as zeros); for
Conv all attributes, ``group`` 1 and the weights' shape but for the output channels (bias
absent as zeros).  A MatMul's bias Adds are merged too when every sibling has one (a
constant per column, alone reading the MatMul).
"""

from __future__ import annotations

from typing import Hashable

import numpy as np

from ember.ir.graph import Graph, Node
from ember.passes.anchors import channel_vector
from ember.passes.rewrite import GraphIndex, constant_value, same_type


def fuse_horizontal(graph: Graph) -> int:
    """Merge sibling MatMul/Gemm/Conv nodes; returns how many groups were merged."""
    merged = 0
    progress = True
    while progress:  # a sweep merges every group it finds; the next finds what they enabled
        progress = False
        index = GraphIndex(graph)
        # Merges of one sweep touch disjoint nodes (a node reads one value as its first
        # input, a bias Add follows one MatMul), so the index stays true for the others.
        for value, readers in list(index.readers.items()):
            groups: dict[Hashable, list[Node]] = {}
            for node in readers:
                key = _sibling_key(index, node, value)
                if key is not None:
                    groups.setdefault(key, []).append(node)
            for key, members in groups.items():
                if len(members) >= 2 and _merge(graph, index, value, key[0], members):
                    merged += 1
                    progress = True
    return merged


def _sibling_key(index: GraphIndex, node: Node, x: str) -> Hashable | None:
    """What siblings must share to be merged, or None if ``node`` cannot be."""
    if node.domain or len(node.inputs) < 2 or node.inputs[0] != x or x in node.inputs[1:] or \
            len(node.outputs) != 1 or not node.outputs[0]:
        return None
    weight = index.constant(node.inputs[1])
    out_type = index.tensor_type(node.outputs[0])
    if weight is None or weight.dtype.kind != "f" or out_type is None or \
            out_type.shape is None or out_type.dtype.numpy != weight.dtype:
        return None
    if node.op == "MatMul":
        if weight.ndim != 2 or len(node.inputs) != 2:
            return None
        return ("MatMul", weight.dtype.str, weight.shape[0])
    if node.op == "Gemm":
        if weight.ndim != 2 or not _constant_or_absent(index, node, 2):
            return None
        attrs = {k: node.attrs.get(k, d) for k, d in
                 (("transA", 0), ("transB", 0), ("alpha", 1.0), ("beta", 1.0))}
        inner = weight.shape[1] if attrs["transB"] else weight.shape[0]
        return ("Gemm", weight.dtype.str, inner, tuple(sorted(attrs.items())))
    if node.op == "Conv":
        if weight.ndim < 3 or node.attrs.get("group", 1) != 1 or \
                not _constant_or_absent(index, node, 2):
            return None
        attrs = tuple(sorted((k, repr(v)) for k, v in node.attrs.items()))
        return ("Conv", weight.dtype.str, weight.shape[1:], attrs)
    return None


def _constant_or_absent(index: GraphIndex, node: Node, position: int) -> bool:
    return len(node.inputs) <= position or not node.inputs[position] or \
        index.constant(node.inputs[position]) is not None


def _merge(graph: Graph, index: GraphIndex, x: str, op: str, members: list[Node]) -> bool:
    first = min(members, key=lambda n: index.position[id(n)])
    stem = first.name or op.lower()
    weights = [index.constant(n.inputs[1]) for n in members]
    out_type = index.tensor_type(first.outputs[0])
    assert out_type is not None and out_type.shape is not None
    if op == "Conv":
        axis, weight_axis = 1, 0
    elif op == "Gemm":
        axis, weight_axis = 1, 0 if first.attrs.get("transB", 0) else 1
    else:
        axis, weight_axis = len(out_type.shape) - 1, 1
    sizes = [int(w.shape[weight_axis]) for w in weights]  # type: ignore[union-attr]
    weight = graph.add_constant(np.concatenate(weights, axis=weight_axis),
                                hint=f"{stem}_merged_w")
    merged = graph.fresh_name(f"{stem}_merged")
    new_nodes: list[Node] = []
    results = [n.outputs[0] for n in members]
    removed = list(members)
    if op == "MatMul":
        new_nodes.append(Node("MatMul", [x, weight], [merged], name=f"{stem}_merged"))
        bias_adds = [_bias_add(index, n) for n in members]
        if all(b is not None for b in bias_adds):
            # One bias per column: [sum of sizes] broadcasts like each sibling's did, since
            # none of them enlarged its MatMul's output.
            biases = [b[1] for b in bias_adds]  # type: ignore[index]
            bias = graph.add_constant(np.concatenate(biases).astype(weights[0].dtype),
                                      hint=f"{stem}_merged_b")
            biased = graph.fresh_name(f"{stem}_merged_biased")
            new_nodes.append(Node("Add", [merged, bias], [biased], name=f"{stem}_merged_bias"))
            merged = biased
            results = [b[0].outputs[0] for b in bias_adds]  # type: ignore[index]
            removed += [b[0] for b in bias_adds]  # type: ignore[index]
    else:
        bias = _merged_bias(graph, op, members, sizes, weights[0].dtype)
        attrs = dict(first.attrs)
        if op == "Gemm":
            new_nodes.append(Node("Gemm", [x, weight, bias], [merged], attrs,
                                  name=f"{stem}_merged"))
        else:
            new_nodes.append(Node("Conv", [x, weight, bias], [merged], attrs,
                                  name=f"{stem}_merged"))
    split = graph.add_constant(np.asarray(sizes, dtype=np.int64), hint=f"{stem}_split")
    new_nodes.append(Node("Split", [merged, split], results, {"axis": axis},
                          name=f"{stem}_split"))
    gone = {id(n) for n in removed}
    nodes: list[Node] = []
    for node in graph.nodes:
        if node is first:
            nodes.extend(new_nodes)
        if id(node) not in gone:
            nodes.append(node)
    graph.nodes = nodes
    for node in removed:
        if node.outputs[0] not in results:
            graph.types.pop(node.outputs[0], None)
    return True


def _bias_add(index: GraphIndex, node: Node) -> tuple[Node, np.ndarray] | None:
    """The Add that alone reads a MatMul's output with a per-column constant, and that
    constant as a vector."""
    out = node.outputs[0]
    add = index.sole_reader(out)
    if add is None or add.op != "Add" or add.domain or len(add.inputs) != 2 or \
            out not in add.inputs or add.inputs[0] == add.inputs[1]:
        return None
    constant = index.constant(add.inputs[1] if add.inputs[0] == out else add.inputs[0])
    out_type = index.tensor_type(out)
    if constant is None or out_type is None or out_type.shape is None or \
            constant.dtype != out_type.dtype.numpy or \
            not same_type(index.type_of(add.outputs[0]), out_type):
        return None
    axis = len(out_type.shape) - 1
    vector = channel_vector(constant, out_type, axis, int(out_type.shape[axis] or 0))
    if vector is None:
        return None
    return add, np.broadcast_to(constant.reshape(-1), (int(out_type.shape[axis]),))


def _merged_bias(graph: Graph, op: str, members: list[Node], sizes: list[int],
                 dtype: np.dtype) -> str:
    """The concatenated bias of Conv or Gemm siblings (zeros where one has none)."""
    parts = []
    full_rows: int | None = None
    for node, size in zip(members, sizes):
        name = node.inputs[2] if len(node.inputs) > 2 else ""
        value = constant_value(graph, name) if name else None
        if value is None:
            parts.append(np.zeros((1, size) if op == "Gemm" else (size,), dtype=dtype))
            continue
        if op == "Conv":
            parts.append(np.broadcast_to(value, (size,)))
            continue
        # Gemm: C broadcasts to [M, N]; keep rows when it has them.
        matrix = value.reshape((1,) * (2 - value.ndim) + value.shape) if value.ndim < 2 \
            else value
        if matrix.shape[0] != 1:
            full_rows = matrix.shape[0]
        parts.append(np.broadcast_to(matrix, (matrix.shape[0], size)))
    if op == "Conv":
        return graph.add_constant(np.concatenate(parts).astype(dtype),
                                  hint=f"{members[0].name or 'conv'}_merged_b")
    rows = full_rows or 1
    parts = [np.broadcast_to(p, (rows, p.shape[1])) for p in parts]
    merged = np.concatenate(parts, axis=1).astype(dtype)
    if rows == 1:
        merged = merged.reshape(-1)
    return graph.add_constant(merged, hint=f"{members[0].name or 'gemm'}_merged_b")
