"""Text from a model reaches generated C only through c_names, which is safe by construction.

A node named ``n*\\<newline>/ extern int system(...); system("touch ..."); /*`` once compiled
into a call of ``system()``: the name went into a C comment that only escaped ``*/``.  These
tests feed every byte value and the known tricks through every name slot of a model and check
that the preprocessed source -- what the C compiler actually compiles -- is the same as with
plain names, and that the payload never runs.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ember
from ember.codegen.c_names import (COMMENT_MAX_CHARS, RESERVED_NAMES, Names, c_comment,
                                   c_identifier)


def _payload(marker: str) -> str:
    return f'n*\\\n/ extern int system(const char *); system("touch {marker}"); /*'


TRICKS = [
    _payload("/tmp/ember-pwned"),
    "*/ int evil; /*",
    "a\\\nb",
    "a\\\r\nb",
    "??/\nint evil;",
    "*??/\n/ int evil; /*",
    "a\0b",
    "line\u2028separator\u2029paragraph",
    "\u00e9\u4e2d\U0001f600",
    "#define x 1\n",
    '"; system("x"); "',
    "'",
    "",
    "exp",
    "memcpy",
    "ember_run",
    "em_helper",
    "_Reserved",
    "__builtin_trap",
    "x" * 5000,
]
EVERY_BYTE = [chr(code) for code in range(256)] + [f"a{chr(code)}b" for code in range(256)]

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
COMMENT = re.compile(r"[A-Za-z0-9_ .,:;=+#@()\[\]<>'-]*\Z")


@pytest.mark.parametrize("text", TRICKS + EVERY_BYTE)
def test_identifiers_and_comments_are_safe(text):
    name = c_identifier(text)
    assert IDENTIFIER.match(name), name
    assert name not in RESERVED_NAMES and not name.startswith(("em_", "ember_", "__"))
    comment = c_comment(text)
    assert COMMENT.match(comment), comment
    assert "*/" not in comment and "/*" not in comment and "??" not in comment
    assert len(comment) <= COMMENT_MAX_CHARS
    fresh = Names().fresh(text)
    assert IDENTIFIER.match(fresh) and fresh not in RESERVED_NAMES


def test_distinct_names_stay_distinct():
    names = TRICKS + EVERY_BYTE
    identifiers = {c_identifier(t) for t in names}
    assert len(identifiers) == len(set(names))
    long_a, long_b = "x" * 300 + "a", "x" * 300 + "b"
    assert c_comment(long_a) != c_comment(long_b)


# ------------------------------------------------------------------------ whole models


def _model(names: dict[str, str]) -> onnx.ModelProto:
    """Add -> Relu -> Gather (run-time indices) -> Mul with a constant: every name slot
    (graph, inputs, outputs, intermediates, initializer, nodes, doc strings) from ``names``."""
    n = names
    nodes = [
        helper.make_node("Add", [n["x"], n["x"]], [n["sum"]], name=n["add"],
                         doc_string=n["doc"]),
        helper.make_node("Relu", [n["sum"]], [n["relu"]], name=n["relu_node"]),
        helper.make_node("Gather", [n["relu"], n["idx"]], [n["picked"]], axis=0,
                         name=n["gather"]),
        helper.make_node("Mul", [n["picked"], n["w"]], [n["y"]], name=n["mul"]),
    ]
    weight = helper.make_tensor(n["w"], TensorProto.FLOAT, [3], [0.5, -2.0, 4.0])
    graph = helper.make_graph(
        nodes, n["graph"],
        [helper.make_tensor_value_info(n["x"], TensorProto.FLOAT, [4, 3]),
         helper.make_tensor_value_info(n["idx"], TensorProto.INT64, [2])],
        [helper.make_tensor_value_info(n["y"], TensorProto.FLOAT, [2, 3])],
        initializer=[weight], doc_string=n["doc"])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name=n["doc"], doc_string=n["doc"])
    return model


SLOTS = ["x", "idx", "sum", "relu", "picked", "w", "y", "add", "relu_node", "gather", "mul",
         "graph", "doc"]
PLAIN = {slot: slot for slot in SLOTS}


def _hostile(trick: str) -> dict[str, str]:
    """Every slot gets the trick, made unique per slot (value names must differ)."""
    return {slot: f"{trick}{i}" if trick else f"v{i}" for i, slot in enumerate(SLOTS)}


def _preprocessed(source: str, tmp_path) -> str:
    """What the C compiler compiles: the source after trigraphs, line splices and comments."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.fail("no C compiler on PATH (the compile path needs one)")
    path = tmp_path / "module.c"
    path.write_text(source, encoding="utf-8")
    result = subprocess.run([cc, "-std=c11", "-E", "-P", str(path)], capture_output=True,
                            text=True, check=True)
    return result.stdout


def _run(model: onnx.ModelProto, names: dict[str, str]):
    module = ember.compile(model)
    x = np.array([[1, -2, 3], [-4, 5, -6], [7, -8, 9], [0, 1, -1]], dtype=np.float32)
    idx = np.array([2, -1], dtype=np.int64)
    output = module.run({names["x"]: x, names["idx"]: idx})[names["y"]]
    expected = np.maximum(x + x, 0)[[2, -1]] * np.array([0.5, -2.0, 4.0], np.float32)
    np.testing.assert_array_equal(output, expected)
    return module


HOSTILE_TRICKS = [t for t in TRICKS if t not in ("", "x" * 5000)] + [
    "".join(chr(c) for c in range(1, 128)), "".join(chr(c) for c in range(128, 256))]


@pytest.mark.parametrize("trick", HOSTILE_TRICKS, ids=range(len(HOSTILE_TRICKS)))
def test_hostile_names_compile_to_the_same_code(trick, tmp_path):
    marker = tmp_path / "pwned"
    trick = trick.replace("/tmp/ember-pwned", str(marker))
    names = _hostile(trick)
    plain = _run(_model(PLAIN), PLAIN)
    hostile = _run(_model(names), names)
    assert not marker.exists(), "text from the model ran as code"
    assert _preprocessed(hostile.build.source, tmp_path) == \
        _preprocessed(plain.build.source, tmp_path)
