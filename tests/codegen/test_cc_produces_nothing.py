"""A C compiler that "succeeds" without writing its output is blamed, not the cache.

``CC=/bin/true`` exits 0 and writes nothing; a wrapper script may leave an empty file.  The
error must name the command, say that it exited 0 without producing the library or object,
and point at ``CC`` -- not tell the user to move a perfectly writable compile cache.
"""

from __future__ import annotations

import shutil
import stat
import uuid

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
from ember.core.target import Target
from ember.toolchain import CompileCache, ToolchainError, compile_shared

TRUE = shutil.which("true")


def _model():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "cc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _empty_output_compiler(tmp_path) -> str:
    """A 'compiler' that answers --version and leaves an empty file at its -o argument."""
    script = tmp_path / "fakecc"
    script.write_text('#!/bin/sh\n[ "$1" = "--version" ] && { echo "fakecc 1.0"; exit 0; }\n'
                      'prev=""\nfor a in "$@"; do [ "$prev" = "-o" ] && : > "$a"; prev="$a"; '
                      'done\nexit 0\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def _assert_blames_the_compiler(message: str, command: str, cache_root) -> None:
    assert f"the C compiler {command} exited with status 0 but produced no" in message
    assert f"$CC is '{command}'" in message and "gcc or clang" in message
    assert "EMBER_CACHE_DIR" not in message and "cannot write" not in message
    assert cache_root.is_dir()  # the cache itself was fine all along


@pytest.mark.skipif(TRUE is None, reason="no 'true' command")
def test_cc_true_compiling_a_model(tmp_path, monkeypatch):
    cache_root = tmp_path / "cache"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(cache_root))
    monkeypatch.setenv("CC", TRUE)
    with pytest.raises(ToolchainError) as info:
        ember.compile(_model())
    _assert_blames_the_compiler(str(info.value), TRUE, cache_root)


@pytest.mark.parametrize("kind", ["true", "empty file"])
def test_a_compiler_that_writes_nothing_building_one_library(tmp_path, monkeypatch, kind):
    if kind == "true" and TRUE is None:
        pytest.skip("no 'true' command")
    command = TRUE if kind == "true" else _empty_output_compiler(tmp_path)
    monkeypatch.setenv("CC", command)
    cache = CompileCache(tmp_path / "cache")
    source = f"/* {uuid.uuid4()} */ int ember_answer(void) {{ return 42; }}\n"
    with pytest.raises(ToolchainError) as info:
        compile_shared(source, Target.native(), cache=cache)
    _assert_blames_the_compiler(str(info.value), command, cache.root)


def test_the_real_compiler_still_builds(tmp_path, monkeypatch):
    """The check does not get in the way of a compiler that works (oracle: numpy)."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    x = np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)
    np.testing.assert_array_equal(ember.compile(_model())(x), np.maximum(x, 0))
