"""The ``ember`` command line, run in-process on tiny models made with onnx.helper."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember import cli
from ember.cli import main
from ember.ir.serialize import load_graph

WEIGHT = np.arange(3, dtype=np.float32) - 1


def _save(tmp_path, nodes, inputs, outputs, initializers=(), name="model.onnx"):
    graph = helper.make_graph(nodes, "tiny", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="cli-test")
    path = tmp_path / name
    onnx.save(model, path)
    return path


def _tiny_model(tmp_path, batch="N"):
    """z = |x + w| with x: f32[batch, 3]."""
    return _save(tmp_path,
                 [helper.make_node("Add", ["x", "w"], ["y"], name="add"),
                  helper.make_node("Abs", ["y"], ["z"], name="abs")],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])],
                 [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
                 [numpy_helper.from_array(WEIGHT, "w")])


def _run(capsys, *argv):
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return status, out, err


def _assert_one_error(status, out, err, *fragments):
    assert status == 2
    assert err.startswith("error: ") and out == ""
    for fragment in fragments:
        assert fragment in err


# ---------------------------------------------------------------------- inspect


def test_inspect_prints_signature_ops_parameters_flops_and_ir(tmp_path, capsys):
    status, out, err = _run(capsys, "inspect", _tiny_model(tmp_path))
    assert status == 0 and err == ""
    for fragment in ("model.onnx", "producer: cli-test", "ai.onnx 17", "f32[N, 3]",
                     "Add", "Abs", "Parameters: 3 in 1 constant(s), 12 bytes",
                     "FLOPs: 6*N FLOPs", "IR check: ok",
                     "graph tiny(%x: f32[N, 3]) -> (%z: f32[N, 3])"):
        assert fragment in out, fragment


def test_inspect_binds_dims_and_can_hide_the_ir(tmp_path, capsys):
    status, out, _ = _run(capsys, "inspect", _tiny_model(tmp_path), "--dim", "N=1000",
                          "--no-ir")
    assert status == 0
    assert "FLOPs: 6.00 KFLOPs" in out and "graph tiny" not in out


def test_inspect_says_unknown_for_unknown_dims(tmp_path, capsys):
    status, out, _ = _run(capsys, "inspect", _tiny_model(tmp_path, batch=None))
    assert status == 0 and "FLOPs: unknown" in out


def test_inspect_json_round_trips_and_can_be_inspected(tmp_path, capsys):
    out_path = tmp_path / "tiny.json"
    status, out, _ = _run(capsys, "inspect", _tiny_model(tmp_path), "--json", out_path)
    assert status == 0 and str(out_path) in out
    graph = load_graph(out_path)
    assert str(graph.types["z"]) == "f32[N, 3]"
    status, again, _ = _run(capsys, "inspect", out_path)
    assert status == 0 and "graph tiny(%x: f32[N, 3])" in again


# ---------------------------------------------------------------------- run


def test_run_with_random_inputs_saves_outputs(tmp_path, capsys):
    out_dir = tmp_path / "out"
    status, out, err = _run(capsys, "run", _tiny_model(tmp_path), "--dim", "N=2", "--seed", "3",
                            "--output-dir", out_dir)
    assert status == 0 and err == ""
    x = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    z = np.load(out_dir / "z.npy")
    np.testing.assert_array_equal(z, np.abs(x + WEIGHT))
    assert "random (seed 3)" in out and "(2, 3)" in out and "float32" in out


def test_run_with_input_file_binds_symbolic_dims(tmp_path, capsys):
    x = np.arange(12, dtype=np.float32).reshape(4, 3) - 6
    np.save(tmp_path / "x.npy", x)
    status, out, _ = _run(capsys, "run", _tiny_model(tmp_path), "--input", f"x={tmp_path}/x.npy",
                          "--output-dir", tmp_path)
    assert status == 0 and "(4, 3)" in out
    np.testing.assert_array_equal(np.load(tmp_path / "z.npy"), np.abs(x + WEIGHT))


def test_run_wrong_input_shape_is_one_clear_error(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((2, 5), np.float32))
    status, out, err = _run(capsys, "run", _tiny_model(tmp_path), "--input",
                            f"x={tmp_path}/x.npy")
    _assert_one_error(status, out, err, "input 'x' has shape (2, 5)", "dimension 1 must be 3")
    assert err.count("\n") == 1


@pytest.mark.parametrize("argv_tail, fragment", [
    (["--input", "nope=missing.npy"], "input 'nope': file 'missing.npy' does not exist"),
    (["--dim", "M=3"], "--dim names unknown dimension(s) ['M']; the model's symbolic "
                       "dimensions are: N"),
])
def test_run_argument_errors(tmp_path, capsys, argv_tail, fragment):
    status, out, err = _run(capsys, "run", _tiny_model(tmp_path), *argv_tail)
    _assert_one_error(status, out, err, fragment)


def test_run_unknown_input_name(tmp_path, capsys):
    np.save(tmp_path / "q.npy", np.zeros(3, np.float32))
    status, out, err = _run(capsys, "run", _tiny_model(tmp_path), "--input",
                            f"q={tmp_path}/q.npy")
    _assert_one_error(status, out, err, "unknown input(s) ['q']")


def test_usage_errors_exit_2(capsys):
    assert main(["run", "model.onnx", "--dim", "N"]) == 2
    assert "expected NAME=VALUE" in capsys.readouterr().err
    assert main([]) == 2
    assert main(["--help"]) == 0


# ---------------------------------------------------------------------- broken models


@pytest.mark.parametrize("command", ["inspect", "run"])
def test_truncated_model(tmp_path, capsys, command):
    path = _tiny_model(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    status, out, err = _run(capsys, command, path)
    _assert_one_error(status, out, err, f"'{path}' is not a valid ONNX model")


def test_missing_model(tmp_path, capsys):
    status, out, err = _run(capsys, "inspect", tmp_path / "nope.onnx")
    _assert_one_error(status, out, err, "does not exist")


def test_unknown_ops_are_all_listed(tmp_path, capsys):
    path = _save(tmp_path,
                 [helper.make_node("Frobnicate", ["x"], ["a"], name="frob_1"),
                  helper.make_node("Abs", ["a"], ["b"], name="abs"),
                  helper.make_node("Wibble", ["b"], ["c"], name="wibble",
                                   domain="com.example"),
                  helper.make_node("Frobnicate", ["c"], ["d"], name="frob_2")],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                 [helper.make_tensor_value_info("d", TensorProto.FLOAT, [2])])
    model = onnx.load(path)
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    onnx.save(model, path)
    status, out, err = _run(capsys, "run", path)
    _assert_one_error(status, out, err, "unsupported op type(s)", "frob_1", "frob_2", "wibble",
                      "Frobnicate", "com.example.Wibble")


def test_internal_errors_exit_1_without_traceback_unless_asked(tmp_path, capsys, monkeypatch):
    def broken(path, **options):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "import_onnx", broken)
    status, out, err = _run(capsys, "inspect", _tiny_model(tmp_path))
    assert status == 1 and err.startswith("error: internal error: RuntimeError: boom")
    with pytest.raises(RuntimeError):
        main(["--traceback", "inspect", str(_tiny_model(tmp_path))])


def test_output_files_for_sequences_optionals_and_clashing_names(tmp_path):
    outputs = {"a/b": np.ones(2), "a:b": np.zeros(1), "seq": [np.ones(1), np.ones(3)],
               "empty": None}
    saved = cli._save_outputs(outputs, tmp_path / "new_dir")
    assert saved == ["a_b.npy", "a_b_.npy", "seq_0.npy", "seq_1.npy"]
    assert np.load(tmp_path / "new_dir" / "seq_1.npy").shape == (3,)
