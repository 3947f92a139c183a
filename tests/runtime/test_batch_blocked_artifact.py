"""A model with a dynamic batch saves as a batch-blocked artifact that runs any batch size.

The oracle is ONNX Runtime on the same ONNX model.  The index's digest is recomputed here from
the format's definition (``artifact_tools.canonical_digest``), as an attacker editing the file
would, so the tampering cases test the loader's other checks, not only the digest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
import ember.runtime
from artifact_tools import DIGEST, ROOT, canonical_digest
from ember.core.errors import InputError, ModelLoadError

RNG = np.random.default_rng(0)


def _model() -> onnx.ModelProto:
    """x[N, 16] and a shared scale[32] -> y[N, 32] (one row per sample) and z[2N, 16] (two
    rows per sample, a Reshape of the same values): batch inputs, an input without the batch,
    and outputs with one and two rows per sample."""
    w = numpy_helper.from_array(RNG.standard_normal((16, 32)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([-1, 16], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Mul", ["h", "scale"], ["hs"]),
             helper.make_node("Relu", ["hs"], ["y"]),
             helper.make_node("Reshape", ["hs", "shape"], ["z"])]
    graph = helper.make_graph(
        nodes, "blocked_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, [32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 16])],
        initializer=[w, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


MODEL = _model()
SCALE = RNG.standard_normal(32).astype(np.float32)


def _expected(x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(MODEL.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x, "scale": SCALE})


def _saved(tmp_path, first_batch: int = 4):
    module = ember.compile(MODEL)
    module(RNG.standard_normal((first_batch, 16)).astype(np.float32), SCALE)
    assert module.batch_split is not None, module.batch_split_reason
    return module, module.save(tmp_path / "model.ember")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return _saved(tmp_path_factory.mktemp("blocked"))[1]


def _copy(saved, tmp_path):
    return shutil.copytree(saved, tmp_path / "copy.ember")


def test_any_batch_size_matches_onnxruntime(saved):
    assert sorted(os.listdir(saved)) == ["b1", "b4", "blocks.json"]
    model = ember.runtime.load(saved)
    assert isinstance(model, ember.runtime.BatchBlockedModel)
    assert model.block_sizes == [4, 1]
    for batch in (1, 3, 4, 9):
        x = RNG.standard_normal((batch, 16)).astype(np.float32)
        y, z = model(x, SCALE)
        want_y, want_z = _expected(x)
        assert y.shape == (batch, 32) and z.shape == (2 * batch, 16)
        np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(z, want_z, rtol=1e-5, atol=1e-5)


def test_save_compiles_the_block_sizes_asked_for(tmp_path):
    module = ember.compile(MODEL)
    module(RNG.standard_normal((4, 16)).astype(np.float32), SCALE)
    path = module.save(tmp_path / "more.ember", batch_blocks=[16, 2])
    model = ember.runtime.load(path)
    assert model.block_sizes == [16, 4, 2, 1]
    x = RNG.standard_normal((23, 16)).astype(np.float32)  # 16 + 4 + 2 + 1
    y, z = model(x, SCALE)
    want_y, want_z = _expected(x)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z, want_z, rtol=1e-5, atol=1e-5)
    for wrong in ([0], [2.5], ["8"], []):
        with pytest.raises(InputError, match="batch_blocks"):
            module.save(tmp_path / "wrong.ember", batch_blocks=wrong)


def test_blocks_with_the_same_weights_load_them_once(saved):
    """The blocks' weights files are compared by the digests the loader checked; equal ones
    give one read-only blob, shared also with another load given the same cache."""
    files = {size: (saved / f"b{size}" / "weights.safetensors").read_bytes() for size in (4, 1)}
    cache: dict = {}
    model = ember.runtime.load(saved, weights_cache=cache)
    again = ember.runtime.load(saved, weights_cache=cache)
    alone = ember.runtime.load(saved)
    blobs = {size: block._weights for size, block in model.blocks}  # noqa: SLF001
    assert (blobs[4] is blobs[1]) == (files[4] == files[1])
    assert all(not blob.flags.writeable for blob in blobs.values())
    assert {id(b._weights) for _, b in again.blocks} == {id(b) for b in blobs.values()}
    assert not {id(b._weights) for _, b in alone.blocks} & {id(b) for b in blobs.values()}
    for batch in (1, 5):
        x = RNG.standard_normal((batch, 16)).astype(np.float32)
        for loaded in (model, again):
            y, z = loaded(x, SCALE)
            want_y, want_z = _expected(x)
            np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(z, want_z, rtol=1e-5, atol=1e-5)


def test_identical_weights_files_of_blocks_are_stored_once(tmp_path):
    """A weights file that several blocks have is written once and hard-linked (256 KB of
    weights here); each block still reads and checks it as its own."""
    w = RNG.standard_normal((256, 256)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 256])],
        initializer=[numpy_helper.from_array(w, "w")])
    module = ember.compile(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    module(np.zeros((8, 256), np.float32))
    path = module.save(tmp_path / "wide.ember", batch_blocks=[4])
    files = {size: path / f"b{size}" / "weights.safetensors" for size in (8, 4, 1)}
    contents = {size: file.read_bytes() for size, file in files.items()}
    for size in (4, 1):
        same = contents[size] == contents[8]
        assert os.path.samefile(files[size], files[8]) == same
    assert any(os.stat(file).st_nlink > 1 for file in files.values())
    x = RNG.standard_normal((13, 256)).astype(np.float32)
    np.testing.assert_allclose(ember.runtime.load(path)(x), x @ w, rtol=1e-4, atol=1e-4)
    # editing the one file breaks every block that has it, each by its own digest
    data = bytearray(contents[8])
    data[-1] ^= 1
    files[8].write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="weights.safetensors"):
        ember.runtime.load(path)


def test_each_block_is_an_ordinary_artifact(saved):
    block = ember.runtime.load(saved / "b4")
    assert isinstance(block, ember.runtime.CompiledModel)
    assert [spec.shape for spec in block.inputs] == [(4, 16), (32,)]
    index = json.loads((saved / "blocks.json").read_text())
    assert index["batch_inputs"] == ["x"] and index["batch_outputs"] == ["y", "z"]
    assert {b["size"]: b["manifest_sha256"] for b in index["blocks"]} == {
        4: block.digest, 1: ember.runtime.load(saved / "b1").digest}


def test_wrong_shapes_are_refused_naming_the_input(saved):
    model = ember.load(saved)
    with pytest.raises(InputError, match=r"'x'.*float32\[N, 16\]"):
        model(np.zeros((3, 15), np.float32), SCALE)
    with pytest.raises(InputError, match="'scale'"):
        model(np.zeros((3, 16), np.float32), np.zeros(31, np.float32))
    with pytest.raises(InputError, match="batch of 0"):
        model(np.zeros((0, 16), np.float32), SCALE)


def test_runs_with_only_numpy_and_the_runtime(saved, tmp_path):
    x = RNG.standard_normal((6, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "scale.npy", SCALE)
    child = textwrap.dedent("""
        import sys, importlib.abc
        class Blocker(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in ("onnx", "onnxruntime", "torch") or (
                        name.startswith("ember.") and not name.startswith("ember.runtime")):
                    raise ImportError(f"blocked in this test: {name}")
                return None
        sys.meta_path.insert(0, Blocker())
        sys.path.insert(0, sys.argv[1])
        import numpy as np
        import ember.runtime
        model = ember.runtime.load(sys.argv[2])
        y, z = model(np.load(sys.argv[3]), np.load(sys.argv[4]))
        np.save(sys.argv[5], y)
    """)
    result = subprocess.run([sys.executable, "-I", "-c", child, str(ROOT), str(saved),
                             str(tmp_path / "x.npy"), str(tmp_path / "scale.npy"),
                             str(tmp_path / "y.npy")], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), _expected(x)[0], rtol=1e-5,
                               atol=1e-5)


def test_digest_pins_every_block(saved):
    model = ember.runtime.load(saved)
    assert ember.runtime.load(saved, expected_digest=model.digest).digest == model.digest
    with pytest.raises(ModelLoadError, match="not the expected one"):
        ember.runtime.load(saved, expected_digest="0" * 64)


def _edit_index(artifact, edit, reseal: bool = True) -> None:
    path = artifact / "blocks.json"
    index = json.loads(path.read_text())
    edit(index)
    if reseal:
        index[DIGEST] = canonical_digest(index)
    path.write_text(json.dumps(index))


@pytest.mark.parametrize("edit, reseal, message", [
    (lambda i: i["blocks"][0].update(size=8), False, "modified or is corrupted"),
    # a block's directory is made from its size: another size finds no directory
    (lambda i: i["blocks"][0].update(size=2), True, r"'b2' is missing"),
    (lambda i: i["blocks"][0].update(size="../b1"), True, "blocks\\[0\\].size"),
    (lambda i: i["blocks"][0].update(size=True), True, "blocks\\[0\\].size"),
    (lambda i: i.update(blocks=[b for b in i["blocks"] if b["size"] != 1]), True,
     "no block of 1 sample"),
    (lambda i: i.update(blocks=i["blocks"] + i["blocks"][:1]), True, "repeats a block size"),
    # the digests of the two blocks swapped: each block is read against the wrong one
    (lambda i: i["blocks"][0].update(manifest_sha256=i["blocks"][1]["manifest_sha256"]), True,
     "not the expected one"),
    (lambda i: i.update(batch_inputs=["w"]), True, r"batch input\(s\) \['w'\]"),
    (lambda i: i.update(batch_inputs=["scale"]), True, "input 'scale'"),
    (lambda i: i.update(extra=1), True, "not a field of this format version"),
    (lambda i: i.update(format_version=3), True, "format version 3 is not supported"),
    (lambda i: i.update(format_version=2), True, "batch_output_axes"),
    (lambda i: i.update(format_version=2, batch_output_axes={"y": 0}), True,
     "batch_output_axes.y"),
    (lambda i: i.update(format_version=2, batch_output_axes={"w": 1}), True,
     "names no batch output"),
    (lambda i: i.update(format_version=2, batch_output_axes={"y": 1}), True,
     "does not match the other blocks"),
])
def test_edited_index_is_refused(saved, tmp_path, edit, reseal, message):
    artifact = _copy(saved, tmp_path)
    _edit_index(artifact, edit, reseal)
    with pytest.raises(ModelLoadError, match=message):
        ember.runtime.load(artifact)


def test_block_swapped_for_a_link_is_refused(saved, tmp_path):
    artifact = _copy(saved, tmp_path)
    shutil.rmtree(artifact / "b1")
    (artifact / "b1").symlink_to(saved / "b1", target_is_directory=True)
    with pytest.raises(ModelLoadError, match="symbolic link"):
        ember.runtime.load(artifact)


def test_edited_block_library_is_refused(saved, tmp_path):
    artifact = _copy(saved, tmp_path)
    library = artifact / "b4" / "model.so"
    data = bytearray(library.read_bytes())
    data[len(data) // 2] ^= 0xFF
    library.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="b4.*corrupted"):
        ember.runtime.load(artifact)


def test_save_choices(tmp_path):
    module, _ = _saved(tmp_path, first_batch=2)
    single = module.save(tmp_path / "single.ember", batch_blocks=False)
    assert (single / "manifest.json").exists() and not (single / "blocks.json").exists()
    only = ember.load(single)
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    np.testing.assert_allclose(only(x, SCALE)[0], _expected(x)[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match="recompile for other shapes"):
        only(np.zeros((3, 16), np.float32), SCALE)
    # the blocked artifact replaces the single one in place, and the other way round
    blocked = module.save(single, batch_blocks=True)
    assert sorted(os.listdir(blocked)) == ["b1", "b2", "blocks.json"]
    assert (module.save(blocked, batch_blocks=False) / "manifest.json").exists()


def test_a_batch_that_mixes_samples_saves_one_specialization(tmp_path):
    """ReduceMean over the batch: no blocks; asking for them names the node that mixes."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["y"], axes=[0], keepdims=1)]
    graph = helper.make_graph(
        nodes, "mixes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    module = ember.compile(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    module(x)
    assert module.batch_split is None
    with pytest.raises(InputError, match="cannot be saved in batch blocks.*ReduceMean"):
        module.save(tmp_path / "a.ember", batch_blocks=True)
    saved = ember.load(module.save(tmp_path / "b.ember"))
    assert isinstance(saved, ember.runtime.CompiledModel)
    np.testing.assert_allclose(saved(x), x.mean(axis=0, keepdims=True), rtol=1e-6)
