"""``ember compile`` and ``ember run`` of artifacts and in compiled mode, run in-process."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember.runtime
from ember.cli import main
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.runtime.cpu import host_arch, host_features

F32 = TensorProto.FLOAT
RNG = np.random.default_rng(5)
W = RNG.standard_normal((3, 4)).astype(np.float32)


def _save(tmp_path, nodes, inputs, outputs, initializers=None, name="model.onnx", opset=17):
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "cli", inputs, outputs, initializer=inits)
    path = tmp_path / name
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    return path


def _dense_model(tmp_path, batch="N"):
    """y = relu(x @ W) with x: f32[batch, 3]."""
    return _save(tmp_path,
                 [helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"),
                  helper.make_node("Relu", ["h"], ["y"], name="relu")],
                 [helper.make_tensor_value_info("x", F32, [batch, 3])],
                 [helper.make_tensor_value_info("y", F32, None)], {"W": W})


def _run(capsys, *argv):
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return status, out, err


def _assert_error(status, out, err, *fragments):
    assert status == 2, (out, err)
    assert err.startswith("error: ")
    for fragment in fragments:
        assert fragment in err, fragment


def test_compile_writes_an_artifact_that_run_runs(tmp_path, capsys):
    model = _dense_model(tmp_path)
    artifact = tmp_path / "out.ember"
    status, out, err = _run(capsys, "compile", model, "-o", artifact, "--dim", "N=4",
                            "--no-batch-blocks")
    assert status == 0 and err == "", err
    assert "2 nodes in 1 compiled kernel (1 fused from several nodes) and 0 numpy fallbacks" \
        in out and f"wrote {artifact}" in out
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["inputs"] == [{"name": "x", "dtype": "float32", "shape": [4, 3]}]
    assert manifest["outputs"] == [{"name": "y", "dtype": "float32", "shape": [4, 4]}]

    x = RNG.standard_normal((4, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    status, out, err = _run(capsys, "run", artifact, "--input", f"x={tmp_path / 'x.npy'}",
                            "--output-dir", tmp_path / "outputs")
    assert status == 0 and err == "", err
    assert "(4, 3)" in out and "(4, 4)" in out and "file" in out
    np.testing.assert_allclose(np.load(tmp_path / "outputs" / "y.npy"),
                               np.maximum(x @ W, 0), rtol=1e-5, atol=1e-6)
    # The artifact is what ember.runtime loads, too.
    np.testing.assert_allclose(ember.runtime.load(artifact).run({"x": x})["y"],
                               np.maximum(x @ W, 0), rtol=1e-5, atol=1e-6)


def test_compile_of_a_dynamic_batch_writes_blocks_that_run_any_batch(tmp_path, capsys):
    artifact = tmp_path / "blocks.ember"
    status, out, err = _run(capsys, "compile", _dense_model(tmp_path), "-o", artifact,
                            "--dim", "N=4")
    assert status == 0 and err == "", err
    assert "batch blocks of 4, 1 sample(s)" in out
    assert sorted(p.name for p in artifact.iterdir()) == ["b1", "b4", "blocks.json"]
    x = RNG.standard_normal((7, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    status, out, err = _run(capsys, "run", artifact, "--input", f"x={tmp_path / 'x.npy'}",
                            "--output-dir", tmp_path / "outputs")
    assert status == 0 and err == "", err
    np.testing.assert_allclose(np.load(tmp_path / "outputs" / "y.npy"), np.maximum(x @ W, 0),
                               rtol=1e-5, atol=1e-6)
    np.save(tmp_path / "bad.npy", np.zeros((7, 2), np.float32))
    status, out, err = _run(capsys, "run", artifact, "--input", f"x={tmp_path / 'bad.npy'}")
    _assert_error(status, out, err, "input 'x'", "(7, 2)", "float32[N, 3]")


def test_compile_with_more_batch_blocks_runs_every_batch_in_few_calls(tmp_path, capsys):
    artifact = tmp_path / "blocks.ember"
    status, out, err = _run(capsys, "compile", _dense_model(tmp_path), "-o", artifact,
                            "--dim", "N=4", "--batch-blocks", "8,2")
    assert status == 0 and err == "", err
    assert "batch blocks of 8, 4, 2, 1 sample(s)" in out
    model = ember.runtime.load(artifact)
    assert model.block_sizes == [8, 4, 2, 1]
    x = RNG.standard_normal((15, 3)).astype(np.float32)  # 8 + 4 + 2 + 1
    np.testing.assert_allclose(model.run({"x": x})["y"], np.maximum(x @ W, 0), rtol=1e-5,
                               atol=1e-6)
    status, out, err = _run(capsys, "compile", _dense_model(tmp_path), "-o", artifact,
                            "--dim", "N=4", "--batch-blocks", "8", "--no-batch-blocks")
    _assert_error(status, out, err, "contradict")


def test_compile_of_a_batch_it_cannot_split_writes_one_specialization(tmp_path, capsys):
    model = _save(tmp_path, [helper.make_node("Softmax", ["x"], ["y"], axis=0)],
                  [helper.make_tensor_value_info("x", F32, ["N", 3])],
                  [helper.make_tensor_value_info("y", F32, None)])
    artifact = tmp_path / "one.ember"
    status, out, err = _run(capsys, "compile", model, "-o", artifact, "--dim", "N=2")
    assert status == 0, err
    assert "one specialization only" in out and "Softmax" in out
    assert (artifact / "manifest.json").exists() and not (artifact / "blocks.json").exists()


def test_run_of_an_artifact_with_random_inputs(tmp_path, capsys):
    artifact = tmp_path / "static.ember"
    assert main(["compile", str(_dense_model(tmp_path, batch=2)), "-o", str(artifact)]) == 0
    capsys.readouterr()
    status, out, err = _run(capsys, "run", artifact, "--seed", "3", "--output-dir", tmp_path)
    assert status == 0 and err == "", err
    assert "random (seed 3)" in out
    x = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), np.maximum(x @ W, 0), rtol=1e-5,
                               atol=1e-6)


def test_compile_replaces_an_existing_artifact(tmp_path, capsys):
    model = _dense_model(tmp_path)
    artifact = tmp_path / "out.ember"
    for batch in (2, 5):
        status, _, err = _run(capsys, "compile", model, "-o", artifact, "--dim", f"N={batch}",
                              "--no-batch-blocks")
        assert status == 0, err
        manifest = json.loads((artifact / "manifest.json").read_text())
        assert manifest["inputs"][0]["shape"] == [batch, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "out.ember"]


def test_compile_without_dim_for_a_dynamic_input_names_the_dimension(tmp_path, capsys):
    artifact = tmp_path / "out.ember"
    status, out, err = _run(capsys, "compile", _dense_model(tmp_path), "-o", artifact)
    _assert_error(status, out, err, "input 'x'", "'N'", "--dim N=SIZE")
    assert not artifact.exists()


def test_compile_with_an_unknown_dim_lists_the_real_ones(tmp_path, capsys):
    status, out, err = _run(capsys, "compile", _dense_model(tmp_path), "-o",
                            tmp_path / "out.ember", "--dim", "batch=2")
    _assert_error(status, out, err, "['batch']", "dimensions are: N")


def test_compile_refuses_to_overwrite_something_else(tmp_path, capsys):
    model = _dense_model(tmp_path)
    status, out, err = _run(capsys, "compile", model, "-o", model, "--dim", "N=1")
    _assert_error(status, out, err, "not an ember artifact")
    import_onnx(model)  # the model file is intact


def test_compile_reports_fallbacks_and_run_executes_them(tmp_path, capsys):
    model = _save(tmp_path,
                  [helper.make_node("MatMul", ["x", "W"], ["p"], name="matmul"),
                   helper.make_node("MeanVarianceNormalization", ["p"], ["h"], axes=[1],
                                    name="mvn"),
                   helper.make_node("Relu", ["h"], ["y"], name="relu")],
                  [helper.make_tensor_value_info("x", F32, [2, 3])],
                  [helper.make_tensor_value_info("y", F32, None)],
                  {"W": W}, opset=26)
    artifact = tmp_path / "fallback.ember"
    status, out, err = _run(capsys, "compile", model, "-o", artifact)
    assert status == 0, err
    assert "1 numpy fallback;" in out and "fallback: node 'mvn' (MeanVarianceNormalization)" in out
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    status, out, err = _run(capsys, "run", artifact, "--input", f"x={tmp_path / 'x.npy'}",
                            "--output-dir", tmp_path / "o")
    assert status == 0, err
    np.testing.assert_allclose(np.load(tmp_path / "o" / "y.npy"),
                               np.maximum(_normalized_rows(x @ W), 0), rtol=1e-5, atol=1e-5)


def _normalized_rows(p: np.ndarray) -> np.ndarray:
    """MeanVarianceNormalization over axis 1 (ONNX's epsilon 1e-9 under the square root)."""
    return (p - p.mean(axis=1, keepdims=True)) / np.sqrt(p.var(axis=1, keepdims=True) + 1e-9)


@pytest.mark.skipif(host_arch() != "x86_64" or "amx_tile" in host_features(),
                    reason="needs an x86-64 host without AMX")
def test_compile_for_another_cpu_works_and_run_refuses_here(tmp_path, capsys):
    artifact = tmp_path / "amx.ember"
    status, out, err = _run(capsys, "compile", _dense_model(tmp_path, batch=2), "-o", artifact,
                            "--target", "x86_64-avx2+amx")
    assert status == 0, err
    status, out, err = _run(capsys, "run", artifact)
    _assert_error(status, out, err, "amx_tile", "recompile")


def test_compile_with_an_unknown_target(tmp_path, capsys):
    status, out, err = _run(capsys, "compile", _dense_model(tmp_path, batch=2), "-o",
                            tmp_path / "out.ember", "--target", "pdp11")
    _assert_error(status, out, err, "unknown target 'pdp11'")


def test_run_of_an_artifact_with_a_wrong_input_shape(tmp_path, capsys):
    artifact = tmp_path / "out.ember"
    assert main(["compile", str(_dense_model(tmp_path)), "-o", str(artifact),
                 "--dim", "N=4", "--no-batch-blocks"]) == 0
    np.save(tmp_path / "x.npy", np.zeros((5, 3), np.float32))
    capsys.readouterr()
    status, out, err = _run(capsys, "run", artifact, "--input", f"x={tmp_path / 'x.npy'}")
    _assert_error(status, out, err, "input 'x'", "(5, 3)", "(4, 3)")


def test_run_of_a_corrupted_artifact(tmp_path, capsys):
    artifact = tmp_path / "out.ember"
    assert main(["compile", str(_dense_model(tmp_path, batch=1)), "-o", str(artifact)]) == 0
    weights = artifact / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    status, out, err = _run(capsys, "run", artifact)
    _assert_error(status, out, err, "weights.safetensors", "corrupted")


def test_run_model_in_compiled_mode_matches_the_reference(tmp_path, capsys):
    model = _dense_model(tmp_path)
    status, out, err = _run(capsys, "run", model, "--mode", "compiled", "--dim", "N=3",
                            "--seed", "1", "--output-dir", tmp_path / "compiled")
    assert status == 0 and err == "", err
    assert "compiled kernel" in out
    status, _, err = _run(capsys, "run", model, "--dim", "N=3", "--seed", "1",
                          "--output-dir", tmp_path / "reference")
    assert status == 0, err
    compiled = np.load(tmp_path / "compiled" / "y.npy")
    assert compiled.shape == (3, 4)
    np.testing.assert_allclose(compiled, np.load(tmp_path / "reference" / "y.npy"), rtol=1e-5,
                               atol=1e-6)


def test_run_in_compiled_mode_with_an_input_file(tmp_path, capsys):
    model = _dense_model(tmp_path)
    x = RNG.standard_normal((6, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    status, out, err = _run(capsys, "run", model, "--mode", "compiled", "--input",
                            f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path)
    assert status == 0, err
    expected = ReferenceExecutor(import_onnx(model)).run({"x": x})["y"]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-5, atol=1e-6)


def test_python_dash_m_ember_cli_reaches_every_command(tmp_path):
    # ``python -m ember.cli`` runs the module as __main__: every subcommand must be defined
    # before main() runs (compile and run-of-artifacts come last in the file).
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "ember.cli", "compile",
                             str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "out.ember")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and "does not exist" in result.stderr


def test_run_refuses_a_tampered_artifact_naming_the_field(tmp_path, capsys):
    """An edited manifest (digest recomputed, as an attacker would) is a clean CLI error."""
    import hashlib

    artifact = tmp_path / "static.ember"
    assert main(["compile", str(_dense_model(tmp_path, batch=2)), "-o", str(artifact)]) == 0
    capsys.readouterr()
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["outputs"][0]["shape"] = [1]
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    manifest["manifest_sha256"] = hashlib.sha256(json.dumps(
        body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    status, out, err = _run(capsys, "run", artifact)
    _assert_error(status, out, err, "outputs[0] ('y') is float32[1] in the manifest, "
                                    "float32[2, 4] in the library")
