"""Saving never deletes what ember did not write.

``Module.save(path)`` and ``ember compile -o path`` used to delete any existing directory
that held a ``manifest.json``, whatever else was in it.  Now an existing target is replaced
only when it is an empty directory or an artifact made of ember's files alone; anything else
is refused with the names of what is in the way, and left exactly as it was.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
import ember.runtime
from ember.cli import main as cli_main
from ember.package import artifact as artifact_module


def _model(scale: float) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.full((4, 3), scale, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "save",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


X = np.ones((2, 4), np.float32)


def _snapshot(root) -> dict[str, bytes]:
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            files[os.path.relpath(path, root)] = open(path, "rb").read()
    return files


def test_a_users_folder_with_a_manifest_is_not_deleted(tmp_path):
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "manifest.json").write_text('{"name": "my web app"}')
    (project / "thesis.tex").write_text("years of work")
    (project / "data" / "results.csv").write_text("1,2,3")
    before = _snapshot(project)
    with pytest.raises(FileExistsError, match="thesis.tex.*not overwriting"):
        ember.compile(_model(1.0)).save(project)
    assert _snapshot(project) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".project.")]


def test_an_artifact_with_a_file_added_is_not_replaced(tmp_path):
    target = ember.compile(_model(1.0)).save(tmp_path / "m.ember")
    (target / "notes.txt").write_text("mine")
    before = _snapshot(target)
    with pytest.raises(FileExistsError, match="notes.txt"):
        ember.compile(_model(2.0)).save(target)
    assert _snapshot(target) == before


@pytest.mark.parametrize("change", ["user manifest", "library replaced", "unlisted file",
                                    "copied manifest"])
def test_files_with_an_artifacts_names_are_not_taken_for_ember_s(tmp_path, change):
    """File names prove nothing: only files a valid manifest lists, with the bytes it
    lists, are ember's to replace (a folder of a user's 'manifest.json' and 'model.so' was
    overwritten)."""
    target = tmp_path / "m.ember"
    if change == "user manifest":
        target.mkdir()
        (target / "manifest.json").write_text('{"name": "my web app"}')
        (target / "model.so").write_bytes(b"my own library")
    else:
        ember.compile(_model(1.0)).save(target)
        if change == "library replaced":
            (target / "model.so").write_bytes(b"my own library")
        elif change == "unlisted file":
            (target / "host_nodes.json").write_text("[]")
        else:  # a valid manifest copied beside a user's files of the same names
            (target / "weights.safetensors").write_bytes(b"my own weights")
    before = _snapshot(target)
    with pytest.raises(FileExistsError, match="did not write"):
        ember.compile(_model(2.0)).save(target)
    assert _snapshot(target) == before


def test_an_artifact_is_replaced_by_a_new_save(tmp_path):
    target = ember.compile(_model(1.0)).save(tmp_path / "m.ember")
    ember.compile(_model(2.0)).save(target)
    np.testing.assert_allclose(ember.runtime.load(target)(X), np.full((2, 3), 8.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ember"]  # nothing left aside


def test_a_batch_blocked_artifact_is_replaced_by_a_new_save(tmp_path):
    model = _model(1.0)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    module = ember.compile(model, input_shapes={"x": (4, 4)})
    target = module.save(tmp_path / "blocks.ember")
    assert (target / "blocks.json").exists()
    ember.compile(_model(3.0)).save(target)
    np.testing.assert_allclose(ember.runtime.load(target)(X), np.full((2, 3), 12.0))


def test_an_empty_directory_is_used_and_a_symlink_or_file_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    ember.compile(_model(1.0)).save(empty)
    np.testing.assert_allclose(ember.runtime.load(empty)(X), np.full((2, 3), 4.0))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    link = tmp_path / "link.ember"
    os.symlink(elsewhere, link)
    with pytest.raises(FileExistsError, match="symbolic link"):
        ember.compile(_model(1.0)).save(link)
    assert _snapshot(elsewhere) == {"keep.txt": b"keep"}
    plain = tmp_path / "plain.ember"
    plain.write_text("not a directory")
    with pytest.raises(FileExistsError, match="not an ember artifact"):
        ember.compile(_model(1.0)).save(plain)
    assert plain.read_text() == "not a directory"


def test_a_failed_save_leaves_the_old_artifact(tmp_path, monkeypatch):
    target = ember.compile(_model(1.0)).save(tmp_path / "m.ember")
    before = _snapshot(target)

    def broken(packed, directory):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(artifact_module, "_write_packed", broken)
    with pytest.raises(OSError, match="(?i)no space left"):
        ember.compile(_model(2.0)).save(target)
    assert _snapshot(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ember"]


def test_cli_compile_refuses_a_folder_with_other_files(tmp_path, capsys):
    model_path = tmp_path / "model.onnx"
    onnx.save(_model(1.0), model_path)
    project = tmp_path / "project"
    project.mkdir()
    (project / "manifest.json").write_text("{}")
    (project / "app.py").write_text("print('hi')")
    before = _snapshot(project)
    status = cli_main(["compile", str(model_path), "-o", str(project)])
    assert status != 0
    assert "app.py" in capsys.readouterr().err
    assert _snapshot(project) == before
