"""`ember export` for other machines: wasm32-wasi run in wasmtime, aarch64-linux run under
qemu-aarch64, both compiled by the ziglang package and compared with the numpy reference.

These need what ``make`` installs for the test suite (the ``ziglang`` and ``wasmtime``
packages, Debian's ``qemu-user-static``); a machine without them skips them, saying which."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys

import numpy as np
import pytest

import ember
from ember.runtime.errors import ExecutionError, InputError

from export_tools import (HOSTILE_INPUT, HOSTILE_OUTPUT, TINYNET, compile_example, reference,
                          two_way_inputs, write_inputs)

needs_zig = pytest.mark.skipif(importlib.util.find_spec("ziglang") is None,
                               reason="cross targets compile with the ziglang package "
                                      "(pip install ziglang; make installs it)")


def _image(batch: int) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((batch, 3, 32, 32)).astype(np.float32)


@needs_zig
def test_wasm32_wasi_module_runs_in_wasmtime(tmp_path, two_way_path):
    pytest.importorskip("wasmtime", reason="running wasm needs the wasmtime package")
    from ember.runtime.wasm import WasmModel

    result = ember.export(TINYNET, tmp_path / "tinynet", target="wasm32-wasi",
                          input_shapes={"input": (2, 3, 32, 32)})
    assert sorted(p.name for p in result.files.values()) == [
        "tinynet.h", "tinynet.wasm", "tinynet.weights"]
    assert (tmp_path / "tinynet" / "tinynet.wasm").read_bytes()[:4] == b"\0asm"
    model = WasmModel(tmp_path / "tinynet")
    image = _image(2)
    logits = model.run({"input": image})["logits"]
    np.testing.assert_allclose(logits, reference(TINYNET, {"input": image})["logits"],
                               rtol=1e-4, atol=1e-4)

    ember.export(two_way_path, tmp_path / "two_way", target="wasm32-wasi")
    model = WasmModel(tmp_path / "two_way")
    feeds = two_way_inputs()
    got, expected = model.run(feeds), reference(two_way_path, feeds)
    np.testing.assert_allclose(got[HOSTILE_OUTPUT], expected[HOSTILE_OUTPUT], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_array_equal(got["rows"], expected["rows"])
    with pytest.raises(ExecutionError, match="index input was out of range"):
        model.run({**feeds, HOSTILE_INPUT: np.array([0, 9, 0], np.int64)})
    with pytest.raises(InputError, match="must be int64"):
        model.run({**feeds, HOSTILE_INPUT: np.array([0, 1, 0], np.int32)})


@needs_zig
def test_wasm32_export_with_run_time_dims(tmp_path, sequence_path):
    pytest.importorskip("wasmtime", reason="running wasm needs the wasmtime package")
    from ember.runtime.wasm import WasmModel

    ember.export(sequence_path, tmp_path / "seq", target="wasm32-wasi",
                 input_shapes={"x": (1, 20, 8)}, dynamic_dims=["seq"])
    model = WasmModel(tmp_path / "seq")
    for length in (16, 29, 20):
        x = np.random.default_rng(length).standard_normal((1, length, 8)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"],
                                   reference(sequence_path, {"x": x})["y"], rtol=1e-5,
                                   atol=1e-6)
    with pytest.raises(InputError, match="seq=40 is outside"):
        model.run({"x": np.zeros((1, 40, 8), np.float32)})


@needs_zig
def test_aarch64_linux_library_runs_under_qemu(tmp_path):
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if qemu is None:
        pytest.skip("running aarch64 code needs qemu-user (apt-get install qemu-user-static; "
                    "make installs it)")
    directory = tmp_path / "tinynet"
    result = ember.export(TINYNET, directory, target="aarch64-linux",
                          input_shapes={"input": (3, 3, 32, 32)})
    assert result.target.arch == "aarch64"
    # the example, linked statically against musl: qemu then needs no aarch64 system files
    zig = [sys.executable, "-m", "ziglang", "cc", "-target", "aarch64-linux-musl", "-static"]
    program = compile_example(directory, "tinynet", tmp_path / "run_model", static=True,
                              compiler=zig)
    elf = program.read_bytes()[:20]
    assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 183  # EM_AARCH64
    image = _image(3)
    out = tmp_path / "out"
    out.mkdir()
    run = subprocess.run([qemu, str(program), str(directory / "tinynet.weights"),
                          *write_inputs(tmp_path, [image]), "-o", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    logits = np.fromfile(out / "output0.bin", np.float32).reshape(3, 10)
    np.testing.assert_allclose(logits, reference(TINYNET, {"input": image})["logits"],
                               rtol=1e-4, atol=1e-4)


def test_export_target_names():
    from ember.package.export import parse_export_target

    assert parse_export_target("host").kind == "native"
    assert parse_export_target("x86_64-linux").vector_bits == 128
    assert parse_export_target("x86_64-avx2-linux").has("avx2")
    assert parse_export_target("aarch64-linux").arch == "aarch64"
    assert parse_export_target("wasm32-wasi").arch == "wasm32"
    with pytest.raises(ember.EmberError, match="does not run on wasi"):
        parse_export_target("aarch64-wasi")
    with pytest.raises(ember.EmberError, match="unknown target"):
        parse_export_target("riscv64-linux")


def test_zig_is_given_cpus_in_its_own_spelling():
    from ember.toolchain.compiler import Compiler

    zig = Compiler((sys.executable, "-m", "ziglang", "cc"), "zig", "zig")
    gcc = Compiler(("gcc",), "gcc", "gcc")
    arm = ember.Target.parse("aarch64+dotprod+fp16")
    assert zig.cpu_flags(arm) == ["-mcpu=generic+dotprod+fullfp16"]
    assert gcc.cpu_flags(arm) == ["-march=armv8.2-a+dotprod+fp16"]
    assert zig.cpu_flags(ember.Target.parse("x86_64-avx2")) == ["-mcpu=x86_64_v3"]
    assert zig.cpu_flags(ember.Target.parse("wasm32")) == ["-msimd128"]


def pattern_input(shape: tuple[int, ...]) -> np.ndarray:
    """The input examples/c/run_model.c and the page make: a fixed pattern."""
    k = np.arange(int(np.prod(shape)), dtype=np.int64)
    return ((k * 7919 % 1000 - 500) / 500).astype(np.float32).reshape(shape)


@needs_zig
def test_wasm32_browser_page_runs_the_model_in_headless_chromium(tmp_path):
    from ember.package.browser import find_browser, open_headless

    if find_browser() is None:
        pytest.skip("the browser test needs Chromium (apt-get install chromium; make "
                    "installs it)")
    directory = tmp_path / "site"
    result = ember.export(TINYNET, directory, target="wasm32-browser",
                          input_shapes={"input": (2, 3, 32, 32)})
    assert {"loader", "page", "wasm", "weights"} <= set(result.files)
    page = open_headless(directory)
    assert "error" not in page, page
    assert page["threads"] == 1 and page["milliseconds"] >= 0
    (output,) = page["outputs"]
    assert output["name"] == "logits" and output["shape"] == [2, 10]
    expected = reference(TINYNET, {"input": pattern_input((2, 3, 32, 32))})["logits"]
    np.testing.assert_allclose(np.array(output["values"], np.float32).reshape(2, 10), expected,
                               rtol=1e-4, atol=1e-4)


_DIMS_PAGE = """<!doctype html><meta charset="utf-8"><script type="module">
import { load } from "./seqnet.js";
const result = {};
try {
  const model = await load();
  result.sample = model.inputs[0].shape;
  model.setDims([27]);
  const input = new Float32Array(model.inputs[0].size);
  for (let k = 0; k < input.length; k++) input[k] = ((k * 7919) % 1000 - 500) / 500;
  result.shape = model.outputs[0].shape;
  result.values = Array.from(model.run([input])[0]);
  try { model.setDims([40]); } catch (error) { result.refused = error.message; }
} catch (error) { result.error = String(error); }
await fetch("result", { method: "POST", body: JSON.stringify(result) });
</script>"""


@needs_zig
def test_the_browser_loader_sets_run_time_dims(tmp_path, sequence_path):
    from ember.package.browser import find_browser, open_headless

    if find_browser() is None:
        pytest.skip("the browser test needs Chromium (apt-get install chromium; make "
                    "installs it)")
    directory = tmp_path / "site"
    ember.export(sequence_path, directory, target="wasm32-browser",
                 input_shapes={"x": (1, 20, 8)}, dynamic_dims=["seq"])
    (directory / "dims.html").write_text(_DIMS_PAGE, encoding="utf-8")
    page = open_headless(directory, "dims.html")
    assert "error" not in page, page
    assert page["sample"] == [1, 20, 8] and page["shape"] == [1, 27, 8]
    expected = reference(sequence_path, {"x": pattern_input((1, 27, 8))})["y"]
    np.testing.assert_allclose(np.array(page["values"], np.float32).reshape(1, 27, 8),
                               expected, rtol=1e-5, atol=1e-6)
    assert "seq=40 is outside" in page["refused"]
