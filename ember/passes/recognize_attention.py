"""Recognize scaled dot-product attention and replace it by one ``Attention`` node.

Exporters write multi-head attention (BERT, GPT-2, ViT with eager attention) as::

    s = MatMul(q, kt)                 q: [B, H, Sq, d], kt: [B, H, d, Skv] (K transposed)
    s = s / c    or    s * c          the scale, optional
    s = s + mask                      an additive float mask, optional
    p = Softmax(s, axis=-1)
    y = MatMul(p, v)                  v: [B, H, Skv, dv]

which is ONNX's ``Attention(q, k, v, mask, scale)`` (opset 23) on 4-D inputs, ``k`` being
``Transpose(kt, [0, 1, 3, 2])`` (a node the simplifier composes with the Transpose that
usually made ``kt``).  One node lets a kernel never store the score matrix whole.

Applies only when it is the same computation: Q, K and V of rank 4 with equal batch and head
dims (Attention does not broadcast them), a scalar scale, a float mask of Q's type whose last
dim is the key length and that does not broadcast the scores to a larger shape, Softmax over
the last axis, and no other reader of the scores or probabilities.  Attention differs from the
written-out form only where that form gave NaN: a row masked entirely with -inf.
"""

from __future__ import annotations

import numpy as np

from ember.core.dims import dims_equal
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.passes.patterns import (AnyOf, Constant, Op, Rewrite, Value, any_scalar, match,
                                   rewrite_matches)
from ember.passes.rewrite import GraphIndex, same_type


def _last_axis(attrs: dict) -> bool:
    return attrs.get("axis") in (-1, 3)


_SCORES = Op("MatMul", Value("q"), Value("kt"), name="scores")
_SCALED = AnyOf(Op("Div", _SCORES, Constant("divisor", any_scalar)),
                Op("Mul", _SCORES, Constant("factor", any_scalar)),
                _SCORES)
_MASKED = AnyOf(Op("Add", _SCALED, Value("mask")), _SCALED)
ATTENTION = Op("MatMul", Op("Softmax", _MASKED, attrs=_last_axis, name="probs"), Value("v"))


def recognize_attention(graph: Graph) -> int:
    """Replace written-out scaled dot-product attention by Attention nodes; returns how many."""
    return rewrite_matches(graph, ("MatMul",), _recognize)


def _recognize(index: GraphIndex, node: Node) -> Rewrite | None:
    root = node.outputs[0]
    found = match(ATTENTION, index, root)
    if found is None or not found.is_private(index):
        return None
    q, kt, v = (index.tensor_type(found.values[n]) for n in ("q", "kt", "v"))
    if not _compatible(q, kt, v):
        return None
    assert q is not None and kt is not None and v is not None and q.shape and kt.shape
    mask = found.values.get("mask")
    if mask is not None and not _mask_fits(index, mask, q, kt):
        return None
    expected = TensorType(q.dtype, q.shape[:3] + v.shape[3:])  # type: ignore[index]
    if not same_type(index.type_of(root), expected):
        return None
    if "divisor" in found.constants:
        divisor = found.scalar("divisor")
        if divisor == 0:
            return None
        scale = 1.0 / divisor
    else:
        scale = found.scalar("factor") if "factor" in found.constants else 1.0
    graph = index.graph
    stem = node.name or "attention"
    k = graph.fresh_name(f"{found.values['kt']}_keys")
    transpose = Node("Transpose", [found.values["kt"]], [k], {"perm": [0, 1, 3, 2]},
                     name=f"{stem}_keys")
    graph.types[k] = TensorType(kt.dtype, (*kt.shape[:2], kt.shape[3], kt.shape[2]))
    inputs = [found.values["q"], k, found.values["v"]] + ([mask] if mask else [])
    attention = Node("Attention", inputs, [root], {"scale": float(np.float64(scale))},
                     name=stem)
    return Rewrite(found, [transpose, attention])


def _compatible(q: TensorType | None, kt: TensorType | None, v: TensorType | None) -> bool:
    """Rank-4 float Q, K^T, V of one type whose batch and head dims are equal (no broadcast)
    and whose inner dims chain: Q [B, H, Sq, d] @ K^T [B, H, d, Skv], P @ V [B, H, Skv, dv]."""
    types = (q, kt, v)
    if any(t is None or t.shape is None or len(t.shape) != 4 for t in types):
        return False
    assert q is not None and kt is not None and v is not None
    if not q.dtype.is_float or kt.dtype != q.dtype or v.dtype != q.dtype:
        return False
    qs, ks, vs = q.shape, kt.shape, v.shape
    assert qs is not None and ks is not None and vs is not None
    same = [(qs[0], ks[0]), (qs[0], vs[0]), (qs[1], ks[1]), (qs[1], vs[1]),
            (qs[3], ks[2]), (ks[3], vs[2])]
    return all(dims_equal(a, b) is True for a, b in same)


def _mask_fits(index: GraphIndex, mask: str, q: TensorType, kt: TensorType) -> bool:
    """A float mask of Q's type, rank <= 4, whose last dim is the key length and whose other
    dims are 1 or those of the scores [B, H, Sq, Skv]."""
    mask_type = index.tensor_type(mask)
    if mask_type is None or mask_type.shape is None or mask_type.dtype != q.dtype:
        return False
    shape = mask_type.shape
    assert q.shape is not None and kt.shape is not None
    scores = (q.shape[0], q.shape[1], q.shape[2], kt.shape[3])
    if not 1 <= len(shape) <= 4 or dims_equal(shape[-1], scores[3]) is not True:
        return False
    return all(d == 1 or dims_equal(d, s) is True
               for d, s in zip(shape[::-1], scores[::-1]))
