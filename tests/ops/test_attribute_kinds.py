"""OpDef.resolve_attrs checks attribute kinds strictly and lists every problem of a node.

A float where an int is declared (``perm=[0.0]``) is a malformed model, not something to round;
an int where a float is declared is fine (ONNX's own checker agrees).  Values that used to make
the coercion itself crash (NaN or a string for an int) must be OpAttributeErrors too.
"""

from __future__ import annotations

import numpy as np
import pytest

from ember.core.errors import OpAttributeError
from ember.ir.graph import Graph, Node
from ember.ops.registry import get_op


def _resolve(op: str, **attrs):
    return get_op(op).resolve_attrs(Node(op, ["x"], ["y"], attrs=attrs, name="n"))


@pytest.mark.parametrize("op, attrs, fragment", [
    ("Transpose", {"perm": [0.0, 1.0]},
     "attribute 'perm' must be of kind ints, got list [0.0, 1.0]"),
    ("Transpose", {"perm": [0, "1"]}, "attribute 'perm' must be of kind ints"),
    ("Transpose", {"perm": (0, True)}, "attribute 'perm' must be of kind ints"),
    ("Softmax", {"axis": 1.0}, "attribute 'axis' must be of kind int, got float 1.0"),
    ("Softmax", {"axis": float("nan")}, "attribute 'axis' must be of kind int, got float nan"),
    ("Softmax", {"axis": "1"}, "attribute 'axis' must be of kind int, got str '1'"),
    ("LeakyRelu", {"alpha": "0.1"}, "attribute 'alpha' must be of kind float"),
    ("Cast", {"to": 1, "saturate": [1]}, "attribute 'saturate' must be of kind int"),
    ("ConstantOfShape", {"value": [1.0]}, "attribute 'value' must be of kind tensor, got list"),
    ("If", {"then_branch": Graph(), "else_branch": [Graph()]},
     "attribute 'else_branch' must be of kind graph, got list"),
])
def test_wrong_kinds_are_refused_by_name(op, attrs, fragment):
    with pytest.raises(OpAttributeError) as info:
        _resolve(op, **attrs)
    assert f"node 'n' ({op}): " in str(info.value)
    assert fragment in str(info.value)


def test_ints_are_valid_floats_and_numpy_scalars_are_normalized():
    assert _resolve("LeakyRelu", alpha=1)["alpha"] == 1.0
    resolved = _resolve("Transpose", perm=[np.int64(1), np.int32(0)])
    assert resolved["perm"] == [1, 0] and all(type(p) is int for p in resolved["perm"])


def test_all_attribute_problems_of_a_node_are_listed_at_once():
    with pytest.raises(OpAttributeError) as info:
        _resolve("Cast", to=1.5, saturate="yes", colour=3)
    message = str(info.value)
    assert "unknown attribute(s) ['colour']" in message
    assert "attribute 'to' must be of kind int" in message
    assert "attribute 'saturate' must be of kind int" in message
