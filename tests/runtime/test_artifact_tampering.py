"""An artifact is untrusted input: every edit an attacker can make is refused with a
ModelLoadError that names the file and the field, before anything of it is used.

Most edits here recompute the manifest's digest (and the file digests) as an attacker would,
so that each check behind the digest is exercised on its own; the loads that could corrupt
memory if a check were missing run in a child process.  The untampered artifact's outputs
and numpy are the oracles.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper
import pytest

import ember
import ember.runtime
from artifact_tools import (compile_c, edit_manifest, load_in_subprocess, mlp_model,
                            numpy_mlp, numpy_topk, read_manifest, refresh_digests, topk_model,
                            TOPK_K, TOPK_LENGTH, TOPK_ROWS)
from ember.core.errors import ModelLoadError

X = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
LOADERS = {"runtime": ember.runtime.load, "ember": ember.load}


@pytest.fixture(scope="module")
def mlp():
    model = mlp_model()
    return model, ember.compile(model)


@pytest.fixture
def artifact(mlp, tmp_path) -> Path:
    return mlp[1].save(tmp_path / "mlp.ember")


def test_untampered_artifact_loads_and_computes_the_model(mlp, artifact):
    model, _ = mlp
    for load in LOADERS.values():
        np.testing.assert_allclose(load(artifact)(X), numpy_mlp(model, X), rtol=1e-4,
                                   atol=1e-4)


# ---------------------------------------------------------------------- file names


EVIL_C = """
#include <stdio.h>
__attribute__((constructor)) static void ember_test_evil(void) {
  FILE *f = fopen("%s", "w");
  if (f) { fputs("constructor ran", f); fclose(f); }
}
int ember_test_evil_marker(void) { return 1; }
"""


@pytest.fixture
def evil_library(tmp_path) -> tuple[Path, Path]:
    """A library whose constructor leaves a marker file behind (what running it proves)."""
    marker = tmp_path / "constructor-ran"
    return compile_c(EVIL_C % marker, tmp_path / "evil.so"), marker


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_library_path_in_the_manifest_is_not_followed(artifact, evil_library, loader):
    _, marker = evil_library
    edit_manifest(artifact, lambda m: m.update(library="../evil.so"))
    with pytest.raises(ModelLoadError, match=r"manifest\.json.*'library' is not a field"):
        LOADERS[loader](artifact)
    assert not marker.exists()


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_weights_path_in_the_manifest_is_not_followed(mlp, artifact, tmp_path, loader):
    other = mlp_model(seed=5)
    other_artifact = ember.compile(other).save(tmp_path / "other.ember")
    edit_manifest(artifact, lambda m: m.update(
        weights_file="../other.ember/weights.safetensors"))
    with pytest.raises(ModelLoadError, match="'weights_file' is not a field"):
        LOADERS[loader](artifact)
    assert other_artifact.exists()


def test_deleted_file_digests_turn_no_check_off(artifact):
    edit_manifest(artifact, lambda m: m.pop("files"))
    with pytest.raises(ModelLoadError, match="field 'files' is missing"):
        ember.runtime.load(artifact)
    edit_manifest(artifact, lambda m: m.update(files={}))
    with pytest.raises(ModelLoadError, match="field 'files.model.so' is missing"):
        ember.runtime.load(artifact)


def test_files_outside_the_fixed_set_are_refused(artifact):
    digest = "0" * 64
    edit_manifest(artifact, lambda m: m["files"].update({"../../etc/passwd": digest}))
    with pytest.raises(ModelLoadError, match=r"'files\.\.\./\.\./etc/passwd' is not a field"):
        ember.runtime.load(artifact)


def test_an_edit_without_a_new_digest_is_detected(artifact):
    edit_manifest(artifact, lambda m: m["outputs"][0].update(shape=[1]), reseal=False)
    with pytest.raises(ModelLoadError, match=r"manifest\.json' was modified or is corrupted"):
        ember.runtime.load(artifact)


def test_pinned_digest_refuses_any_other_artifact_before_loading_it(artifact, evil_library,
                                                                    tmp_path):
    pinned = ember.runtime.load(artifact).digest
    assert pinned == read_manifest(artifact)["manifest_sha256"]
    assert ember.runtime.load(artifact, expected_digest=pinned)(X).shape == (3, 4)
    evil, marker = evil_library
    shutil.copyfile(evil, artifact / "model.so")
    refresh_digests(artifact)  # a consistent artifact, but not the pinned one
    for load in LOADERS.values():
        with pytest.raises(ModelLoadError, match="not the expected one"):
            load(artifact, expected_digest=pinned)
    assert not marker.exists()


def test_a_replaced_library_without_a_signature_is_refused(artifact, evil_library):
    evil, _ = evil_library
    shutil.copyfile(evil, artifact / "model.so")
    refresh_digests(artifact)
    with pytest.raises(ModelLoadError, match="does not export ember_run"):
        ember.runtime.load(artifact)


OLD_LIBRARY_C = """
#include <stdint.h>
int64_t ember_workspace_size(void) { return %d; }
int32_t ember_run(void *const *i, void *const *o, const uint8_t *w, uint8_t *ws, void *h,
                  void *c) { return 0; }
"""


def test_a_library_of_an_older_ember_is_refused(artifact, tmp_path):
    workspace = read_manifest(artifact)["workspace_size"]
    compile_c(OLD_LIBRARY_C % workspace, tmp_path / "old.so")
    shutil.copyfile(tmp_path / "old.so", artifact / "model.so")
    refresh_digests(artifact)
    with pytest.raises(ModelLoadError, match="built by an older ember; rebuild"):
        ember.runtime.load(artifact)


# ---------------------------------------------------------------------- the signature


def _shape(field: str, index: int, shape: list[int]):
    return lambda m: m[field][index].update(shape=shape)


SIGNATURE_EDITS = {
    "output shape [1]": (_shape("outputs", 0, [1]), r"outputs\[0\] \('y'\) is float32\[1\]"),
    "input dtype float64": (lambda m: m["inputs"][0].update(dtype="float64"),
                            r"inputs\[0\] \('x'\) is float64\[3, 16\]"),
    "larger input": (_shape("inputs", 0, [6, 16]), r"inputs\[0\] \('x'\) is float32\[6, 16\]"),
    "workspace 0": (lambda m: m.update(workspace_size=0), "workspace_size is 0"),
    "larger weights blob": (lambda m: m.update(weights_size=m["weights_size"] + 64),
                            "weights_size is 2752 in the manifest, 2688 in the library"),
    "an output less": (lambda m: m.update(outputs=[]), "outputs has 0 entries"),
    # found by the fuzzer: a weight moved inside the blob (or re-shaped to the same size)
    # passed every other check and ran on other values
    "weight re-shaped": (lambda m: m["weights"]["w1"].update(shape=[32, 16]),
                         "weights differ: .*float32\\[32, 16\\] at offset 0"),
}


@pytest.mark.parametrize("case", sorted(SIGNATURE_EDITS))
def test_edited_buffer_sizes_are_refused_by_the_library_signature(artifact, case):
    """Edits that pass every schema check and carry a fresh digest: only the library's own
    description of its buffers tells.  (Before it existed, such a load crashed or read past an
    input, so it runs in a child process.)"""
    edit, fragment = SIGNATURE_EDITS[case]
    edit_manifest(artifact, edit)
    result = load_in_subprocess(artifact)
    assert result["error"] == "ModelLoadError", result
    assert "does not describe the library" in result["message"]
    assert re.search(fragment, result["message"]), result["message"]


def test_a_library_from_another_artifact_is_refused_with_every_digest_recomputed(artifact,
                                                                                 tmp_path):
    other = ember.compile(mlp_model(batch=5)).save(tmp_path / "batch5.ember")
    shutil.copyfile(other / "model.so", artifact / "model.so")
    refresh_digests(artifact)
    manifest = read_manifest(artifact)
    assert manifest["files"]["model.so"] == read_manifest(other)["files"]["model.so"]
    result = load_in_subprocess(artifact)
    assert result["error"] == "ModelLoadError", result
    assert "float32[3, 16] in the manifest, float32[5, 16] in the library" in result["message"]


# ---------------------------------------------------------------------- the schema


SCHEMA_EDITS = {
    "workspace -5": (lambda m: m.update(workspace_size=-5), "'workspace_size' is -5, outside"),
    "workspace 2**62": (lambda m: m.update(workspace_size=2**62), "'workspace_size' is 4611"),
    "workspace as text": (lambda m: m.update(workspace_size="768"),
                          "'workspace_size' must be an integer, found a JSON string"),
    "workspace as float": (lambda m: m.update(workspace_size=768.0),
                           "'workspace_size' must be an integer, found a JSON number"),
    "weight past the blob": (lambda m: m["weights"]["w2"].update(offset=m["weights_size"]),
                             "'weights.w2.offset' puts bytes"),
    "weights overlap": (lambda m: m["weights"]["b1"].update(offset=0),
                        r"'weights\.(b1|w1)\.offset' overlaps weight '(w1|b1)'"),
    "weight nbytes": (lambda m: m["weights"]["w1"].update(nbytes=4),
                      r"'weights.w1.nbytes' is 4, but float32\[16, 32\] takes 2048"),
    "negative dim": (_shape("inputs", 0, [-3, 16]), r"'inputs\[0\].shape\[0\]' is -3"),
    "boolean dim": (_shape("inputs", 0, [True, 16]), r"'inputs\[0\].shape\[0\]' must be an int"),
    "float dim": (_shape("inputs", 0, [3.0, 16]), r"'inputs\[0\].shape\[0\]' must be an int"),
    "shape not a list": (_shape("inputs", 0, "3x16"), r"'inputs\[0\].shape' must be a JSON list"),
    "huge buffer": (_shape("outputs", 0, [2**40, 2**40]), r"'outputs\[0\].shape' makes a buffer"),
    "unknown dtype": (lambda m: m["inputs"][0].update(dtype="float33"),
                      "unknown element type 'float33'"),
    "numpy-only dtype": (lambda m: m["outputs"][0].update(dtype="object"),
                         "unknown element type 'object'"),
    "missing outputs": (lambda m: m.pop("outputs"), "field 'outputs' is missing"),
    "missing input dtype": (lambda m: m["inputs"][0].pop("dtype"),
                            r"'inputs\[0\].dtype' is missing"),
    "input twice": (lambda m: m.update(inputs=m["inputs"] * 2),
                    r"'inputs\[1\].name' repeats the input name 'x'"),
    "inputs an object": (lambda m: m.update(inputs={"x": [3, 16]}),
                         "'inputs' must be a JSON list, found a JSON object"),
    "invented host node": (lambda m: m["host_nodes"].append(
        {"index": 0, "op": "Relu", "name": "n", "reason": "", "inputs": [],
         "implicit_inputs": [], "outputs": []}), "'files.host_nodes.json' is missing"),
    "range check low > high": (lambda m: m["checks"].append(
        {"node_index": 0, "node": "n", "op": "Gather", "input": "i", "low": 5, "high": 1}),
        r"'checks\[0\].high' is 1, outside"),
    "digest not hex": (lambda m: m.update(manifest_sha256="x" * 64), "'manifest_sha256' is "),
    "format version 1": (lambda m: m.update(format_version=1),
                         "format version 1 is not supported"),
    "target without arch": (lambda m: m["target"].pop("arch"), "'target.arch' is missing"),
}


@pytest.mark.parametrize("case", sorted(SCHEMA_EDITS))
def test_manifest_fields_are_validated_before_use(artifact, case):
    edit, fragment = SCHEMA_EDITS[case]
    edit_manifest(artifact, edit, reseal=case != "digest not hex")
    with pytest.raises(ModelLoadError) as error:
        ember.runtime.load(artifact)
    message = str(error.value)
    assert "manifest.json" in message
    assert re.search(fragment, message), message


@pytest.mark.parametrize("content,fragment", [
    (b"[1, 2, 3]", "must hold a JSON object, found a JSON list"),
    (b'"ember"', "must hold a JSON object, found a JSON string"),
    (b'{"format": "ember-artifact", ', "is not valid JSON"),
    (b"\xff\xfe{}", "is not valid UTF-8"),
    (b'{"format": 1, "format": 2}', "has the key 'format' twice"),
    (b'{"format": NaN}', "is not valid JSON"),
    (b'{"format_version": 1e999}', "out of range"),
    (b"[" * 100_000 + b"]" * 100_000, "is not valid JSON"),
], ids=["list", "string", "truncated", "not-utf8", "duplicate-key", "nan", "infinity",
         "deep"])
def test_malformed_manifest_is_a_model_load_error(artifact, content, fragment):
    (artifact / "manifest.json").write_bytes(content)
    for load in LOADERS.values():
        with pytest.raises(ModelLoadError, match=fragment):
            load(artifact)


def test_runtime_knows_every_element_type_the_compiler_stores():
    """The runtime's closed list of dtype names (it may not import the compiler's) agrees with
    ember.core.dtypes on names and sizes."""
    from ember.driver.pipeline import STORABLE_DTYPES
    from ember.runtime.dtypes import ITEMSIZE, numpy_dtype

    for dtype in STORABLE_DTYPES:
        name = dtype.numpy.name
        assert ITEMSIZE.get(name) == dtype.numpy.itemsize, name
        assert numpy_dtype(name) == dtype.numpy
    assert set(ITEMSIZE) == {d.numpy.name for d in STORABLE_DTYPES}


# ---------------------------------------------------------------------- file kinds


def _replace_with_symlink(path: Path, target: str | Path) -> None:
    path.unlink()
    path.symlink_to(target)


def test_symlink_to_dev_zero_is_refused_without_hanging(artifact):
    _replace_with_symlink(artifact / "model.so", "/dev/zero")
    result = load_in_subprocess(artifact)
    assert result["error"] == "ModelLoadError", result
    assert "'model.so' is a symbolic link" in result["message"]


def test_fifo_is_refused_without_hanging(artifact):
    (artifact / "weights.safetensors").unlink()
    os.mkfifo(artifact / "weights.safetensors")
    result = load_in_subprocess(artifact)
    assert result["error"] == "ModelLoadError", result
    assert "'weights.safetensors' is a FIFO, not a regular file" in result["message"]


def test_character_device_is_refused_without_hanging(artifact):
    (artifact / "model.so").unlink()
    try:
        os.mknod(artifact / "model.so", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")
    result = load_in_subprocess(artifact)
    assert result["error"] == "ModelLoadError", result
    assert "'model.so' is a device, not a regular file" in result["message"]


def test_directory_is_refused(artifact):
    (artifact / "model.so").unlink()
    (artifact / "model.so").mkdir()
    with pytest.raises(ModelLoadError, match="'model.so' is a directory, not a regular file"):
        ember.runtime.load(artifact)


def test_symlink_is_refused_even_to_the_right_content(artifact, tmp_path):
    """A link could point anywhere later; the content check alone would accept this one."""
    outside = tmp_path / "weights-elsewhere.safetensors"
    shutil.copyfile(artifact / "weights.safetensors", outside)
    _replace_with_symlink(artifact / "weights.safetensors", outside)
    with pytest.raises(ModelLoadError, match="'weights.safetensors' is a symbolic link"):
        ember.runtime.load(artifact)
    manifest = artifact / "manifest.json"
    shutil.move(manifest, tmp_path / "manifest.json")
    manifest.symlink_to(tmp_path / "manifest.json")
    with pytest.raises(ModelLoadError, match="'manifest.json' is a symbolic link"):
        ember.runtime.load(artifact)


def test_oversized_file_is_refused_without_reading_it(artifact):
    weights = artifact / "weights.safetensors"
    os.truncate(weights, 8 + (100 << 20) + read_manifest(artifact)["weights_size"] + 1)
    with pytest.raises(ModelLoadError, match="'weights.safetensors' is .* bytes, more than"):
        ember.runtime.load(artifact)


# ---------------------------------------------------------------------- weights file


def _safetensors(header: object, body: bytes = b"", raw_header: bytes | None = None) -> bytes:
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + body


def test_weights_file_with_a_bad_header_is_refused(artifact):
    (artifact / "weights.safetensors").write_bytes(
        _safetensors(None, b"\0" * 64, raw_header=b'{"w0": {"dtype": "F32", '))
    refresh_digests(artifact)
    with pytest.raises(ModelLoadError, match="header of artifact .*'weights.safetensors'.* "
                                             "is not valid JSON"):
        ember.runtime.load(artifact)


def test_weights_file_with_offsets_past_the_end_is_refused(artifact):
    header = {"w0": {"dtype": "F32", "shape": [16, 32], "data_offsets": [0, 2048]},
              "w1": {"dtype": "F32", "shape": [32], "data_offsets": [2048, 2176]},
              "w2": {"dtype": "F32", "shape": [32, 4], "data_offsets": [2176, 1 << 40]}}
    (artifact / "weights.safetensors").write_bytes(_safetensors(header, b"\0" * 2688))
    refresh_digests(artifact)
    with pytest.raises(ModelLoadError, match="tensor 'w2' has data_offsets .* outside"):
        ember.runtime.load(artifact)


def test_weights_file_whose_tensor_shape_differs_from_the_manifest_is_refused(artifact):
    """Found by the fuzzer: a 0-d tensor where the manifest has [32] raised ValueError."""
    header = {"w0": {"dtype": "F32", "shape": [16, 32], "data_offsets": [0, 2048]},
              "w1": {"dtype": "F32", "shape": [], "data_offsets": [2048, 2052]},
              "w2": {"dtype": "F32", "shape": [32, 4], "data_offsets": [2052, 2564]}}
    (artifact / "weights.safetensors").write_bytes(_safetensors(header, b"\0" * 2564))
    refresh_digests(artifact)
    with pytest.raises(ModelLoadError, match=r"tensor 'w1' is float32\[\], the manifest's "
                                             r"weight 'b1' is float32\[32\]"):
        ember.runtime.load(artifact)


# ---------------------------------------------------------------------- host nodes


@pytest.fixture(scope="module")
def topk_module():
    return ember.compile(topk_model())


@pytest.fixture
def topk_artifact(topk_module, tmp_path) -> Path:
    return topk_module.save(tmp_path / "topk.ember")


TOPK_X = np.random.default_rng(2).uniform(1, 2, (TOPK_ROWS, TOPK_LENGTH)).astype(
    np.float32)


def _edit_host_nodes(artifact: Path, edit) -> None:
    path = artifact / "host_nodes.json"
    details = json.loads(path.read_text())
    edit(details)
    path.write_text(json.dumps(details))
    refresh_digests(artifact)


def test_fallback_artifact_runs_through_ember_load(topk_artifact):
    y, indices = ember.load(topk_artifact)(TOPK_X)
    expected_y, expected_indices = numpy_topk(TOPK_X)
    np.testing.assert_array_equal(indices, expected_indices)
    np.testing.assert_allclose(y, expected_y, rtol=1e-6)


def _node(details):
    return details["1"]["node"]["graph"]


HOST_NODE_EDITS = {
    "not JSON": (None, "'host_nodes.json' is not valid JSON"),
    "a list": (lambda d: d.update({"1": []}), "the entry of node 1 must be a JSON object"),
    "another node index": (lambda d: d.update({"7": d.pop("1")}),
                           r"describes nodes \['7'\], the manifest's host_nodes are \['1'\]"),
    "graph not an object": (lambda d: d["1"]["node"].update(graph=5),
                            "node 1 .*malformed ember graph JSON"),
    "another op": (lambda d: _node(d)["nodes"][0].update(op="Relu"),
                   r"(?s)node 1 \('TopK'\): not a valid node graph.*Relu"),
    "unknown op": (lambda d: _node(d)["nodes"][0].update(op="NoSuchOp"),
                   "op 'NoSuchOp' is not registered"),
    "two nodes": (lambda d: _node(d)["nodes"].append(dict(_node(d)["nodes"][0])),
                  "value 'values' is defined twice"),
    "bigger output type": (lambda d: _node(d)["types"]["values"].update(shape=[3, 10]),
                           rf"value 'values' is f32\[3, 10\], the manifest's buffer is "
                           rf"float32\[3, {TOPK_K}\]"),
    "an input less": (lambda d: (_node(d)["nodes"][0].update(inputs=["r"]),
                                 _node(d).update(inputs=["r"])),
                      "TopK takes 2"),
    "extra field": (lambda d: d["1"].update(code="import os"),
                    "must be an object with one field 'node'"),
}


@pytest.mark.parametrize("case", sorted(HOST_NODE_EDITS))
def test_malformed_host_nodes_file_is_a_model_load_error(topk_artifact, case):
    edit, fragment = HOST_NODE_EDITS[case]
    if edit is None:
        (topk_artifact / "host_nodes.json").write_bytes(b'{"1": {"node": ')
        refresh_digests(topk_artifact)
    else:
        _edit_host_nodes(topk_artifact, edit)
    with pytest.raises(ModelLoadError, match=fragment) as error:
        ember.load(topk_artifact)
    assert "host_nodes.json" in str(error.value)


def test_host_node_buffers_are_checked_against_the_library(topk_artifact):
    """The callback gets views sized from the manifest's host-node entries: a larger one
    would let the reference write past the library's buffer."""
    edit_manifest(topk_artifact, lambda m: m["host_nodes"][0]["outputs"][0].update(
        shape=[3, 10]))
    with pytest.raises(ModelLoadError, match=r"host_nodes\[0\].outputs\[0\] \('values'\) is "
                                             rf"float32\[3, 10\] in the manifest, "
                                             rf"float32\[3, {TOPK_K}\]"):
        ember.load(topk_artifact)


def test_a_weight_moved_inside_its_padding_is_refused(tmp_path):
    """Found by the fuzzer: a constant's offset moved within the alignment padding after it
    (no overlap, inside the blob, digest recomputed) loaded and ran on shifted values."""
    rng = np.random.default_rng(3)
    bias = numpy_helper.from_array(rng.standard_normal(30).astype(np.float32), "bias")
    scale = numpy_helper.from_array(rng.standard_normal(30).astype(np.float32), "scale")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["h"]), helper.make_node("Mul", ["h", "scale"],
                                                                         ["y"])],
        "padded", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [30])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [30])], initializer=[bias, scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    artifact = ember.compile(model).save(tmp_path / "padded.ember")
    first = min(read_manifest(artifact)["weights"].values(), key=lambda w: w["offset"])
    assert first["nbytes"] == 120, "the first weight must be followed by padding"
    edit_manifest(artifact, lambda m: next(w for w in m["weights"].values()
                                           if w["offset"] == first["offset"]).update(
        offset=first["offset"] + 4))
    result = load_in_subprocess(artifact)
    assert result["error"] == "ModelLoadError", result
    assert "weights differ" in result["message"], result["message"]


# ---------------------------------------------------------------------- in memory


def test_a_module_compiled_in_process_runs_the_packed_artifact(mlp, tmp_path):
    """ember.compile loads its code through the same checks as ember.load, from memory: the
    packed bytes are what ``save`` writes, and a changed byte is refused before loading."""
    from ember.package.artifact import pack_artifact
    from ember.runtime.artifact import artifact_from_memory
    from ember.runtime.manifest import LIBRARY_FILE, WEIGHTS_FILE

    model, module = mlp
    packed = pack_artifact(module.build)
    saved = module.save(tmp_path / "saved.ember")
    for name, data in packed.files.items():
        assert (saved / name).read_bytes() == data
    assert read_manifest(saved) == packed.manifest

    fresh = ember.compile(model)
    np.testing.assert_allclose(fresh(X), numpy_mlp(model, X), rtol=1e-4, atol=1e-4)

    for name in (LIBRARY_FILE, WEIGHTS_FILE):
        changed = dict(packed.files)
        changed[name] = changed[name][:-1] + bytes([changed[name][-1] ^ 1])
        with pytest.raises(ModelLoadError, match=f"'{name}' is corrupted or was modified"):
            artifact_from_memory(packed.manifest, changed, "in memory")
    with pytest.raises(ModelLoadError, match="has no file 'weights.safetensors'"):
        artifact_from_memory(packed.manifest, {LIBRARY_FILE: packed.files[LIBRARY_FILE]},
                             "in memory")


# ---------------------------------------------------------------------- schedules


@pytest.mark.parametrize("schedules, problem", [
    ("not a list", "must be a JSON list"),
    ([{"step": 0, "workload_key": "k", "source": "tuned"}], "'schedules[0].config' is missing"),
    ([{"step": -1, "workload_key": "k", "source": "tuned", "config": {}}], "schedules[0].step"),
    ([{"step": 0, "workload_key": "k", "source": "tuned", "config": {"a": {"b": 1}}}],
     "schedules[0].config.a"),
    ([{"step": 0, "workload_key": "k", "source": "tuned", "config": {}, "path": "/x"}],
     "'schedules[0].path' is not a field"),
])
def test_a_malformed_schedules_record_is_refused(artifact, schedules, problem):
    """``schedules`` (the configs of kernels not scheduled by the default heuristic) is
    informational, yet parsed as strictly as every other field."""
    edit_manifest(artifact, lambda m: m.update(schedules=schedules))
    with pytest.raises(ModelLoadError, match=re.escape(problem)):
        ember.runtime.load(artifact)


def test_an_artifact_built_with_given_configs_lists_them(tmp_path):
    model = mlp_model()
    plain = ember.compile(model)
    key = plain.build.kernels[0].workload_key
    config = plain.build.kernels[0].config
    module = ember.compile(model, kernel_configs={key: config})
    artifact = module.save(tmp_path / "given.ember")
    entries = read_manifest(artifact)["schedules"]
    assert [(e["workload_key"], e["source"]) for e in entries] == [(key, "given")] * sum(
        1 for impl in module.build.kernels if impl.workload_key == key)
    loaded = ember.runtime.load(artifact)
    assert loaded.manifest.schedules[0].workload_key == key
    np.testing.assert_allclose(loaded(X), numpy_mlp(model, X), rtol=1e-4, atol=1e-4)
    assert "schedules" not in read_manifest(plain.save(tmp_path / "plain.ember"))
