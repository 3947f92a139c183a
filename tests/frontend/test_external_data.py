"""External tensor data is read only from inside the model's directory (or ``base_dir``).

A model's external-data location is text from an untrusted file.  The oracle is the
tensor's own bytes: a model whose weights live beside it must import with exactly them, and
every way out of the directory -- a model given as bytes or a proto read relative to the
working directory, ``..``, an absolute path, a symbolic link, a FIFO, a short file, a length
that disagrees with the shape -- must be a ModelLoadError that names the tensor.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.core.errors import ModelLoadError
from ember.frontend.onnx import import_onnx
from ember.onnx_backend import EmberBackend

WEIGHT = np.arange(12, dtype=np.float32).reshape(3, 4) / 7


def _external(name: str, array: np.ndarray, location: str, offset: int = 0,
              length: int | None = None) -> onnx.TensorProto:
    tensor = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT, dims=array.shape)
    tensor.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": str(offset)}
    if length is not None:
        entries["length"] = str(length)
    for key, value in entries.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _model(tensor: onnx.TensorProto | None = None, sparse: onnx.SparseTensorProto | None = None
           ) -> onnx.ModelProto:
    """y = x @ w, with w an initializer or a sparse initializer."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    graph = helper.make_graph(
        nodes, "ext", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[tensor] if tensor is not None else [],
        sparse_initializer=[sparse] if sparse is not None else [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _weight_of(graph) -> np.ndarray:
    return np.asarray(graph.constants["w"])


@pytest.fixture
def in_other_cwd(tmp_path, monkeypatch) -> Path:
    """A working directory holding a file an attacker would like to read."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "id_rsa").write_bytes(np.full(12, 66.0, np.float32).tobytes())
    monkeypatch.chdir(cwd)
    return cwd


def test_a_model_file_reads_its_data_from_its_own_directory(tmp_path, in_other_cwd):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "id_rsa").write_bytes(b"\0" * 8 + WEIGHT.tobytes())
    onnx.save(_model(_external("w", WEIGHT, "id_rsa", offset=8, length=48)),
              folder / "m.onnx")
    np.testing.assert_array_equal(_weight_of(import_onnx(folder / "m.onnx")), WEIGHT)
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(ember.compile(folder / "m.onnx")(x), x @ WEIGHT, rtol=1e-6)


@pytest.mark.parametrize("given", ["bytes", "proto"])
def test_bytes_or_a_proto_never_read_the_working_directory(in_other_cwd, given):
    model = _model(_external("w", WEIGHT, "id_rsa"))
    source = model.SerializeToString() if given == "bytes" else model
    for load in (lambda: import_onnx(source), lambda: ember.compile(source),
                 lambda: EmberBackend.prepare(source)):
        with pytest.raises(ModelLoadError, match="initializer 'w'.*'id_rsa'.*base_dir"):
            load()


def test_base_dir_names_where_the_data_is(tmp_path, in_other_cwd):
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "id_rsa").write_bytes(WEIGHT.tobytes())
    model = _model(_external("w", WEIGHT, "id_rsa"))
    graph = import_onnx(model.SerializeToString(), base_dir=folder)
    np.testing.assert_array_equal(_weight_of(graph), WEIGHT)
    assert model.graph.initializer[0].data_location == TensorProto.EXTERNAL  # not changed
    rep = EmberBackend.prepare(model, base_dir=str(folder))
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(rep.run([x])[0], x @ WEIGHT, rtol=1e-6)


def test_sparse_initializers_read_the_models_directory(tmp_path, in_other_cwd):
    """Their values were read relative to the working directory even for a model file."""
    folder = tmp_path / "model"
    folder.mkdir()
    values = np.array([1.5, -2.0, 3.25], np.float32)
    (folder / "id_rsa").write_bytes(values.tobytes())
    sparse = helper.make_sparse_tensor(_external("w", values, "id_rsa"),
                                       numpy_helper.from_array(np.array([0, 5, 11], np.int64),
                                                               "w_indices"), [3, 4])
    onnx.save(_model(sparse=sparse), folder / "m.onnx")
    expected = np.zeros(12, np.float32)
    expected[[0, 5, 11]] = values
    np.testing.assert_array_equal(_weight_of(import_onnx(folder / "m.onnx")),
                                  expected.reshape(3, 4))


@pytest.mark.parametrize("location, message", [
    ("../secret.bin", "leaves the model's directory"),
    ("sub/../../secret.bin", "leaves the model's directory"),
    ("/etc/hostname", "leaves the model's directory"),
    ("", "not a relative file name"),
    ("link.bin", "symbolic link"),
    ("linkdir/data.bin", "symbolic link"),
    ("fifo", "not a regular file"),
    ("missing.bin", "does not exist"),
    ("short.bin", "holds 8 bytes"),
])
def test_locations_outside_or_unfit_are_refused(tmp_path, location, message):
    folder = tmp_path / "model"
    (folder / "inside").mkdir(parents=True)
    (tmp_path / "secret.bin").write_bytes(WEIGHT.tobytes())
    os.symlink(tmp_path / "secret.bin", folder / "link.bin")
    os.symlink(tmp_path, folder / "linkdir")
    (tmp_path / "data.bin").write_bytes(WEIGHT.tobytes())
    os.mkfifo(folder / "fifo")
    (folder / "short.bin").write_bytes(b"\0" * 8)
    onnx.save(_model(_external("w", WEIGHT, location)), folder / "m.onnx")
    with pytest.raises(ModelLoadError, match=message):
        import_onnx(folder / "m.onnx")


def test_a_length_that_disagrees_with_the_shape_is_refused(tmp_path):
    (tmp_path / "w.bin").write_bytes(WEIGHT.tobytes() * 2)
    onnx.save(_model(_external("w", WEIGHT, "w.bin", length=96)), tmp_path / "m.onnx")
    with pytest.raises(ModelLoadError, match="length 96 differs from the 48 bytes"):
        import_onnx(tmp_path / "m.onnx")


def test_external_data_counts_against_the_memory_budget(tmp_path):
    (tmp_path / "w.bin").write_bytes(WEIGHT.tobytes())
    onnx.save(_model(_external("w", WEIGHT, "w.bin")), tmp_path / "m.onnx")
    with pytest.raises(ModelLoadError, match="memory budget"):
        import_onnx(tmp_path / "m.onnx", memory_limit=16)


def test_a_location_that_is_not_utf8_is_refused(tmp_path):
    """protobuf hands an invalid UTF-8 string field over as bytes: the location must be
    refused with a clear error, never used as a path (it was a TypeError)."""
    (tmp_path / "wXY.bin").write_bytes(WEIGHT.tobytes())
    data = _model(_external("w", WEIGHT, "wXY.bin")).SerializeToString()
    assert data.count(b"wXY.bin") == 1
    (tmp_path / "m.onnx").write_bytes(data.replace(b"wXY.bin", b"w\xff\xfe.bin"))
    with pytest.raises(ModelLoadError, match="not valid UTF-8"):
        import_onnx(tmp_path / "m.onnx")
