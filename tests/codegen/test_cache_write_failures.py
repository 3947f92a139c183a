"""A compile cache that cannot be written does not fail the compile.

The cache is an optimization: when writing it fails (a full disk, a quota, a read-only mount)
the build goes on in a temporary directory of the process, with one ``CacheWarning`` per cache
directory naming it, the cause and what to do.  Only when the temporary directory cannot be
written either is the compile a ``ToolchainError``, naming both.  Failures are simulated by
making the cache's writes raise, and made real with a read-only directory where this machine
allows a private mount namespace.  Compiled models are checked against numpy.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.toolchain import CacheWarning, CompileCache, ToolchainError
from ember.toolchain import cache as cache_module

W = np.random.default_rng(0).standard_normal((24, 24)).astype(np.float32)


def _model(scale: float) -> onnx.ModelProto:
    """A fresh graph per ``scale`` (a cache miss): y = relu(x @ w) * scale."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="project"),
         helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("Mul", ["r", "s"], ["y"], name="scale")], "cached",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 24])],
        initializer=[numpy_helper.from_array(W, "w"),
                     numpy_helper.from_array(np.array(scale, np.float32), "s")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _check(module, scale: float) -> None:
    x = np.random.default_rng(1).standard_normal((3, 24)).astype(np.float32)
    np.testing.assert_allclose(module(x), np.maximum(x @ W, 0) * scale, rtol=1e-5, atol=1e-5)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh cache directory, and a fresh record of the directories warned about."""
    root = tmp_path / "cache"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(root))
    monkeypatch.setattr(cache_module, "_warned_roots", set(), raising=False)
    return root


def _compile_recording(model: onnx.ModelProto):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = ember.compile(model)
    return module, [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]


@pytest.mark.parametrize("code,cause", [(errno.ENOSPC, "no space left on device"),
                                        (errno.EDQUOT, "disk quota exceeded")])
def test_a_full_cache_warns_once_and_compiles_without_it(cache_dir, monkeypatch, code, cause):
    real = CompileCache.write_text

    def write_text(self, key, suffix, text):
        if self.root == cache_dir:
            raise OSError(code, os.strerror(code))
        return real(self, key, suffix, text)

    monkeypatch.setattr(CompileCache, "write_text", write_text)
    first, warned = _compile_recording(_model(1.5))
    _check(first, 1.5)
    assert len(warned) == 1, warned
    assert f"compile cache {cache_dir} cannot be written ({cause})" in warned[0]
    assert "EMBER_CACHE_DIR" in warned[0]
    second, warned_again = _compile_recording(_model(2.5))
    _check(second, 2.5)
    assert warned_again == [], "the warning is given once per cache directory"
    assert not any(p.suffix in (".so", ".o") for p in cache_dir.iterdir())


def test_a_cache_that_cannot_be_created_warns_and_compiles(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(cache_module, "_warned_roots", set(), raising=False)
    module, warned = _compile_recording(_model(3.5))
    _check(module, 3.5)
    assert len(warned) == 1 and "a-file/cache cannot be written" in warned[0]


def test_no_writable_place_at_all_is_an_error_naming_both(cache_dir, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(CompileCache, "write_text", full)
    monkeypatch.setattr(cache_module, "_fallback", None, raising=False)
    monkeypatch.setattr(tempfile, "mkdtemp", full)
    with pytest.raises(ToolchainError) as info, pytest.warns(CacheWarning):
        ember.compile(_model(4.5))
    message = str(info.value)
    assert f"no space left on device while writing the compile cache '{cache_dir}'" in message
    assert "no space left on device while writing a temporary directory" in message
    assert "EMBER_CACHE_DIR" in message and "TMPDIR" in message


_COMPILE = textwrap.dedent("""
    import sys, warnings
    import numpy as np, onnx
    import ember
    from ember.toolchain import CacheWarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = ember.compile(onnx.load(sys.argv[1]))
    x = np.random.default_rng(1).standard_normal((3, 24)).astype(np.float32)
    np.save(sys.argv[2], module(x))
    for w in caught:
        if issubclass(w.category, CacheWarning):
            print("WARNED", w.message)
""")


def _namespaces_available() -> bool:
    if shutil.which("unshare") is None or sys.platform != "linux":
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs -o size=16k,ro tmpfs $d && "
                            "umount $d && rmdir $d"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _namespaces_available(),
                    reason="needs unshare -rm and tmpfs mounts (a private mount namespace)")
def test_a_real_read_only_cache_directory(tmp_path):
    model_path = tmp_path / "model.onnx"
    onnx.save(_model(5.5), model_path)
    mounted = tmp_path / "ro"
    mounted.mkdir()
    script = tmp_path / "compile.py"
    script.write_text(_COMPILE)
    out = tmp_path / "y.npy"
    env = dict(os.environ, EMBER_CACHE_DIR=str(mounted / "cache"))
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c",
         f"mount -t tmpfs -o size=1m,ro tmpfs '{mounted}' && '{sys.executable}' '{script}' "
         f"'{model_path}' '{out}'"], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"WARNED the compile cache {mounted / 'cache'} cannot be written (read-only file " \
           f"system" in result.stdout, result.stdout + result.stderr
    x = np.random.default_rng(1).standard_normal((3, 24)).astype(np.float32)
    np.testing.assert_allclose(np.load(out), np.maximum(x @ W, 0) * 5.5, rtol=1e-5, atol=1e-5)
