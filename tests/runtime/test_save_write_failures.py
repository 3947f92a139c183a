"""Saving an artifact to a full, over-quota, read-only or forbidden location.

The user gets an ``EmberError`` (still an ``OSError`` with the original errno) that names the
artifact, the file and the cause, and nothing half-written is left: the target is absent or
the artifact already there is unchanged and still runs.  Failures are simulated by making the
write of one file raise, and -- where this machine allows a private mount namespace -- made
real on a tiny tmpfs (ENOSPC) and a read-only one (EROFS).  Outputs are checked against numpy.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
import ember.runtime
from ember.cli import main as cli_main
from ember.core.errors import EmberError

W = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)


def _model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="project")], "saved",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])],
        initializer=[numpy_helper.from_array(W, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _check_runs(path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    np.testing.assert_allclose(ember.runtime.load(path)(x), x @ W, rtol=1e-5, atol=1e-5)


def _fail_writes_named(monkeypatch, name: str, code: int) -> None:
    """Make writing the artifact file ``name`` fail as the OS would: ``write()`` on an open
    file raises an OSError with an errno and no file name."""
    real = Path.write_bytes

    def write_bytes(self: Path, data: bytes) -> int:
        if self.name == name:
            raise OSError(code, os.strerror(code))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)


CAUSES = [(errno.ENOSPC, "no space left on device", "Free space"),
          (errno.EDQUOT, "disk quota exceeded", "raise the quota"),
          (errno.EROFS, "read-only file system", "writable"),
          (errno.EACCES, "permission denied", "writable")]


@pytest.mark.parametrize("code,cause,advice", CAUSES)
def test_a_failed_write_names_artifact_file_and_cause_and_leaves_nothing(
        tmp_path, monkeypatch, code, cause, advice):
    module = ember.compile(_model())
    target = tmp_path / "model.ember"
    _fail_writes_named(monkeypatch, "model.so", code)
    with pytest.raises(EmberError) as info:
        module.save(target)
    message = str(info.value)
    assert f"cannot save the artifact '{target}'" in message
    assert f"{cause} while writing its file 'model.so'" in message
    assert advice in message and "nothing was left behind" in message
    assert isinstance(info.value, OSError) and info.value.errno == code
    assert list(tmp_path.iterdir()) == []  # no temporary directory, no partial artifact


def test_a_failed_write_keeps_the_artifact_already_there(tmp_path, monkeypatch):
    module = ember.compile(_model())
    target = module.save(tmp_path / "model.ember")
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    _fail_writes_named(monkeypatch, "manifest.json", errno.ENOSPC)
    with pytest.raises(EmberError, match=f"artifact already at '{target}' is unchanged"):
        module.save(target)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.ember"]
    _check_runs(target)


def test_cli_compile_reports_a_full_disk_by_path_and_cause(tmp_path, monkeypatch, capsys):
    model_path = tmp_path / "model.onnx"
    onnx.save(_model(), model_path)
    out = tmp_path / "out.ember"
    _fail_writes_named(monkeypatch, "weights.safetensors", errno.ENOSPC)
    status = cli_main(["compile", str(model_path), "-o", str(out)])
    captured = capsys.readouterr()
    text = " ".join((captured.out + captured.err).split())  # the console wraps long lines
    assert status != 0
    assert "no space left on device while writing its file 'weights.safetensors'" in text
    assert str(out) in text and not out.exists()


# ---------------------------------------------------------------- real file systems

_SAVE = textwrap.dedent("""
    import sys
    import numpy as np, onnx
    import ember
    model = onnx.load(sys.argv[1])
    module = ember.compile(model)
    try:
        module.save(sys.argv[2])
    except ember.EmberError as error:
        print("EMBER_ERROR", type(error).__name__, isinstance(error, OSError), error.errno)
        print(error)
""")


def _namespaces_available() -> bool:
    if shutil.which("unshare") is None or sys.platform != "linux":
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs -o size=16k tmpfs $d && "
                            "umount $d && rmdir $d"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _namespaces_available(),
                    reason="needs unshare -rm and tmpfs mounts (a private mount namespace)")
@pytest.mark.parametrize("mount,cause", [("size=32k", "no space left on device"),
                                         ("size=1m,ro", "read-only file system")])
def test_a_real_full_or_read_only_file_system(tmp_path, mount, cause):
    """The compile cache stays where it is (a writable disk); only the target is mounted."""
    model_path = tmp_path / "model.onnx"
    onnx.save(_model(), model_path)
    mounted = tmp_path / "mnt"
    mounted.mkdir()
    target = mounted / "model.ember"
    script = tmp_path / "save.py"
    script.write_text(_SAVE)
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c",
         f"mount -t tmpfs -o {mount} tmpfs '{mounted}' && '{sys.executable}' '{script}' "
         f"'{model_path}' '{target}'; echo LEFT: $(ls -A '{mounted}')"],
        capture_output=True, text=True, timeout=300)
    report = result.stdout + result.stderr
    assert "EMBER_ERROR WriteError True" in result.stdout, report
    assert f"cannot save the artifact '{target}': {cause}" in result.stdout, report
    assert "LEFT: \n" in result.stdout or result.stdout.rstrip().endswith("LEFT:"), report
