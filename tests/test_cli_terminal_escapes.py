"""Control characters in a model's text never reach the terminal raw.

A model named with escape sequences (clear screen, set the window title, an OSC 8 link that
shows one URL and opens another), C1 controls and a bidirectional override is inspected,
run, compiled and profiled through the command line; the output must hold none of those
characters, and must still show the names, escaped (``\\x1b``).
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember.cli import main
from ember.core.text import printable

HOSTILE = {
    "clear": "\x1b[2J\x1b[H",
    "title": "\x1b]0;owned\x07",
    "link": "\x1b]8;;https://evil.example\x1b\\https://good.example\x1b]8;;\x1b\\",
    "c1": "\x9b31m",
    "bidi": "abc\u202edcb",
}
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _model(tmp_path) -> str:
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w" + HOSTILE["c1"])
    nodes = [helper.make_node("MatMul", ["x" + HOSTILE["title"], w.name], ["h" + HOSTILE["link"]],
                              name="mm" + HOSTILE["clear"]),
             helper.make_node("Relu", ["h" + HOSTILE["link"]], ["y" + HOSTILE["bidi"]],
                              name="relu" + HOSTILE["bidi"])]
    graph = helper.make_graph(
        nodes, "model" + HOSTILE["title"],
        [helper.make_tensor_value_info("x" + HOSTILE["title"], TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y" + HOSTILE["bidi"], TensorProto.FLOAT, [2, 3])],
        initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="tool" + HOSTILE["clear"])
    model.ir_version = 8
    path = tmp_path / "hostile.onnx"
    onnx.save(model, path)
    return str(path)


@pytest.mark.parametrize("command", [
    ["inspect"], ["inspect", "--stages"], ["run"], ["run", "--mode", "compiled"],
    ["profile", "--repeat", "2", "--warmup", "0"], ["compile", "-o", "{tmp}/out.ember"],
])
def test_no_control_character_reaches_the_terminal(tmp_path, capsys, command):
    model = _model(tmp_path)
    argv = [part.replace("{tmp}", str(tmp_path)) for part in command]
    status = main([argv[0], model, *argv[1:]])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert not RAW.search(out + err), repr(RAW.search(out + err))
    if argv[0] != "compile":
        assert "\\x1b" in out  # the names are shown, escaped


@pytest.mark.parametrize("argv", [
    ["run", "{model}", "--dim", "n=" + HOSTILE["clear"] + HOSTILE["title"]],
    ["profile", "{model}", "--shape", "x=" + HOSTILE["link"]],
    ["run", "{model}", "--mode", HOSTILE["c1"]],
])
def test_argument_errors_escape_the_argument_they_quote(tmp_path, capsys, argv):
    """argparse's own error messages quote the refused argument (they wrote it raw)."""
    model = _model(tmp_path)
    status = main([part.replace("{model}", model) for part in argv])
    out, err = capsys.readouterr()
    assert status == 2 and "error: argument" in err, err
    assert not RAW.search(out + err), repr(RAW.search(out + err))
    assert "\\x1b" in err or "\\x9b" in err


def test_printable_escapes_and_keeps_ordinary_text():
    assert printable("conv1/weight: f32[64, 3, 7, 7]\tok\n") == \
        "conv1/weight: f32[64, 3, 7, 7]\tok\n"
    assert printable("a\x1b[2Jb\x07\x9b\u202e") == "a\\x1b[2Jb\\x07\\x9b\\u202e"
