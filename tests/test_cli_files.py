"""The command line refuses files it cannot read to the end, sizes it cannot allocate, and
never lets two outputs share a file.

A FIFO given as the model or an ``--input`` used to block forever; ``/dev/zero`` was read
until MemoryError; a huge ``--dim`` ended in "internal error: MemoryError"; an output named
``s_0`` beside a sequence output ``s`` overwrote its first item's file.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ember.cli import main


def _relu_model(tmp_path, dims=("N", 4)) -> str:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    return str(path)


def _run_with_deadline(argv, seconds=60):
    """main(argv) in a thread: a command that blocks on a FIFO fails the test, not the run."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("status", main(argv)),
                              daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"ember {' '.join(argv)} blocked"
    return result["status"]


@pytest.mark.parametrize("where", ["model", "input"])
def test_a_fifo_is_refused_without_blocking(tmp_path, capsys, where):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    model = _relu_model(tmp_path)
    argv = ["run", str(fifo)] if where == "model" else \
        ["run", model, "--input", f"x={fifo}"]
    assert _run_with_deadline(argv) == 2
    assert "is a FIFO" in capsys.readouterr().err


def test_a_device_is_refused(tmp_path, capsys):
    assert _run_with_deadline(["inspect", "/dev/zero"]) == 2
    assert "is a device" in capsys.readouterr().err
    model = _relu_model(tmp_path)
    assert _run_with_deadline(["run", model, "--input", "x=/dev/zero"]) == 2
    assert "is a device" in capsys.readouterr().err


def test_a_huge_dim_is_an_input_error_not_a_memory_error(tmp_path, capsys):
    model = _relu_model(tmp_path)
    status = main(["run", model, "--dim", "N=1000000000000"])
    err = capsys.readouterr().err
    assert status == 2 and "memory budget" in err and "internal error" not in err


def test_outputs_never_share_a_file(tmp_path, capsys):
    """A sequence output 's' (items s_0.npy, s_1.npy) beside outputs named 's_0' and 'S_1'."""
    seq = helper.make_node("SequenceConstruct", ["x", "x"], ["s"])
    nodes = [seq, helper.make_node("Relu", ["x"], ["s_0"]), helper.make_node("Neg", ["x"], ["S_1"])]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "clash", [value("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2]),
                               value("s_0", TensorProto.FLOAT, [2]),
                               value("S_1", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "clash.onnx"
    onnx.save(model, path)
    x = np.array([-1.0, 2.0], np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    assert main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}",
                 "--output-dir", str(out)]) == 0
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 4, files  # s_0, s_1, and the two outputs, each its own file
    contents = sorted(tuple(np.load(out / name).tolist()) for name in files)
    assert contents == sorted([tuple(x), tuple(x), (0.0, 2.0), (1.0, -2.0)])
