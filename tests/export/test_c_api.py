"""`ember export` for the host: the C API, the example program with no Python, the weights
checks, the errors, and the export directory's safety."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ember
from ember.cli import main as cli_main
from ember.package.c_api import ExportError, c_prefix, c_string_literal
from ember.toolchain.compiler import ToolchainError

from export_tools import (HOSTILE_INPUT, HOSTILE_OUTPUT, TINYNET, compile_example,
                          reference, two_way_inputs, write_inputs)

BATCH = 2


@pytest.fixture(scope="module")
def tinynet_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("export") / "tinynet"
    result = ember.export(TINYNET, directory, input_shapes={"input": (BATCH, 3, 32, 32)})
    assert result.prefix == "tinynet" and result.directory == directory
    return directory


@pytest.fixture(scope="module")
def two_way_export(tmp_path_factory: pytest.TempPathFactory, two_way_path: Path) -> Path:
    directory = tmp_path_factory.mktemp("export") / "two_way"
    ember.export(two_way_path, directory, name="two-way model")
    return directory


def _image() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((BATCH, 3, 32, 32)).astype(np.float32)


def test_export_writes_header_libraries_and_weights(tinynet_export):
    names = sorted(os.listdir(tinynet_export))
    assert names == ["README.md", "export.json", "libtinynet.a", "libtinynet.so", "tinynet.h",
                     "tinynet.weights"]
    header = (tinynet_export / "tinynet.h").read_text()
    for declaration in ("int tinynet_run(tinynet_model *model, const void *const *inputs",
                        "#define TINYNET_API_VERSION 1", "void tinynet_destroy(",
                        "const char *tinynet_last_error(void);"):
        assert declaration in header


@pytest.mark.parametrize("static", [False, True], ids=["shared", "static"])
def test_example_program_runs_with_nothing_but_libc(tinynet_export, tmp_path, static):
    program = compile_example(tinynet_export, "tinynet", tmp_path / "run_model", static=static)
    image = _image()
    out = tmp_path / "out"
    out.mkdir()
    # an empty environment: no PATH, no Python, no ember
    result = subprocess.run([str(program), str(tinynet_export / "tinynet.weights"),
                             *write_inputs(tmp_path, [image]), "-o", str(out), "-r", "3"],
                            env={}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "output 0 'logits' [2, 10]" in result.stdout
    logits = np.fromfile(out / "output0.bin", np.float32).reshape(BATCH, 10)
    expected = reference(TINYNET, {"input": image})["logits"]
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    ldd = shutil.which("ldd")
    if ldd is not None:
        linked = subprocess.run([ldd, str(program)], capture_output=True, text=True).stdout
        libraries = {line.split()[0] for line in linked.splitlines() if line.strip()}
        allowed = {"linux-vdso.so.1", "libc.so.6", "libm.so.6", "libpthread.so.0",
                   "libtinynet.so"}
        assert {name for name in libraries if not name.startswith("/")} <= allowed, linked
        assert ("libtinynet.so" in libraries) == (not static)


def _api(directory: Path, prefix: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(directory / f"lib{prefix}.so"))
    for kind in ("input", "output"):
        getattr(lib, f"{prefix}_{kind}_name").restype = ctypes.c_char_p
        getattr(lib, f"{prefix}_{kind}_shape").restype = ctypes.POINTER(ctypes.c_int64)
        getattr(lib, f"{prefix}_{kind}_nbytes").restype = ctypes.c_size_t
        getattr(lib, f"{prefix}_{kind}_index").argtypes = [ctypes.c_char_p]
    getattr(lib, f"{prefix}_last_error").restype = ctypes.c_char_p
    getattr(lib, f"{prefix}_status_name").restype = ctypes.c_char_p
    getattr(lib, f"{prefix}_open").argtypes = [ctypes.c_int, ctypes.c_char_p,
                                               ctypes.POINTER(ctypes.c_void_p)]
    getattr(lib, f"{prefix}_open_memory").argtypes = [ctypes.c_int, ctypes.c_char_p,
                                                      ctypes.c_size_t,
                                                      ctypes.POINTER(ctypes.c_void_p)]
    getattr(lib, f"{prefix}_run").argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                              ctypes.c_void_p]
    getattr(lib, f"{prefix}_destroy").argtypes = [ctypes.c_void_p]
    return lib


def test_signature_by_index_and_by_name_with_names_no_identifier_holds(two_way_export):
    prefix = "two_way_model"
    lib = _api(two_way_export, prefix)
    assert lib.two_way_model_num_inputs() == 2 and lib.two_way_model_num_outputs() == 2
    assert lib.two_way_model_input_name(1).decode("utf-8") == HOSTILE_INPUT
    assert lib.two_way_model_output_name(0).decode("utf-8") == HOSTILE_OUTPUT
    assert lib.two_way_model_input_index(HOSTILE_INPUT.encode("utf-8")) == 1
    assert lib.two_way_model_output_index(b"rows") == 1
    assert lib.two_way_model_input_index(b"nope") == -1
    assert lib.two_way_model_input_dtype(1) == 7 and lib.two_way_model_output_dtype(1) == 1
    assert lib.two_way_model_input_rank(0) == 2
    assert lib.two_way_model_input_shape(0)[:2] == [2, 5]
    assert lib.two_way_model_output_nbytes(0) == 2 * 4 * 4
    assert lib.two_way_model_input_name(2) is None and lib.two_way_model_input_rank(-1) == -1


def _open(lib: ctypes.CDLL, prefix: str, path: Path, version: int = 1
          ) -> tuple[int, ctypes.c_void_p, str]:
    handle = ctypes.c_void_p()
    status = getattr(lib, f"{prefix}_open")(version, str(path).encode(), ctypes.byref(handle))
    return status, handle, getattr(lib, f"{prefix}_last_error")().decode()


def test_runs_through_the_api_with_any_output_alignment(two_way_export, two_way_path):
    prefix = "two_way_model"
    lib = _api(two_way_export, prefix)
    status, handle, _ = _open(lib, prefix, two_way_export / "two_way_model.weights")
    assert status == 0 and handle.value
    feeds = two_way_inputs()
    expected = reference(two_way_path, feeds)
    arena = np.zeros(4096, np.uint8)
    base = arena.ctypes.data
    first = base + (-base % 64) + 4  # misaligned: the library writes an aligned copy first
    second = first + 256
    inputs = (ctypes.c_void_p * 2)(feeds["x"].ctypes.data, feeds[HOSTILE_INPUT].ctypes.data)
    outputs = (ctypes.c_void_p * 2)(first, second)
    assert lib.two_way_model_run(handle, inputs, outputs) == 0
    got = np.frombuffer(ctypes.string_at(first, 32), np.float32).reshape(2, 4)
    rows = np.frombuffer(ctypes.string_at(second, 36), np.float32).reshape(3, 3)
    np.testing.assert_allclose(got, expected[HOSTILE_OUTPUT], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(rows, expected["rows"])

    # an index out of range: the step that failed, not a read out of bounds
    bad = np.array([6, 0, 0], np.int64)
    inputs[1] = bad.ctypes.data
    assert lib.two_way_model_run(handle, inputs, outputs) == 6
    message = lib.two_way_model_last_error().decode()
    assert "index input was out of range" in message
    assert lib.two_way_model_status_name(6) == b"EMBER_ERROR_RUN"
    # an output over an input, a NULL output: refused, named
    outputs[0] = feeds["x"].ctypes.data
    inputs[1] = feeds[HOSTILE_INPUT].ctypes.data
    assert lib.two_way_model_run(handle, inputs, outputs) == 1
    assert "overlaps input 0 ('x')" in lib.two_way_model_last_error().decode()
    outputs[0] = None
    assert lib.two_way_model_run(handle, inputs, outputs) == 1
    assert lib.two_way_model_run(None, inputs, outputs) == 1
    lib.two_way_model_destroy(handle)
    lib.two_way_model_destroy(None)  # a no-op, as free(NULL)


def test_weights_of_another_model_build_or_a_damaged_file_are_refused(
        tinynet_export, two_way_export, tmp_path):
    lib = _api(tinynet_export, "tinynet")
    weights = tinynet_export / "tinynet.weights"
    status, _, message = _open(lib, "tinynet", tmp_path / "missing.weights")
    assert status == 2 and "cannot open the weights file" in message
    status, _, message = _open(lib, "tinynet", two_way_export / "two_way_model.weights")
    assert status == 3 and "another model's or another build's" in message
    data = weights.read_bytes()
    cases = {"truncated": data[:-10], "magic": b"X" + data[1:], "extra": data + b"\0",
             "flipped": data[:-1] + bytes([data[-1] ^ 1])}
    expected = {"truncated": "ends before", "magic": "not an ember weights file",
                "extra": "bytes after its weights", "flipped": "do not match their SHA-256"}
    for case, content in cases.items():
        path = tmp_path / f"{case}.weights"
        path.write_bytes(content)
        status, handle, message = _open(lib, "tinynet", path)
        assert status == 3 and expected[case] in message, (case, message)
        assert not handle.value
    status, _, message = _open(lib, "tinynet", weights, version=2)
    assert status == 5 and "version 2 of tinynet.h" in message
    # the same bytes from memory
    handle = ctypes.c_void_p()
    assert lib.tinynet_open_memory(1, data, len(data), ctypes.byref(handle)) == 0
    lib.tinynet_destroy(handle)
    assert lib.tinynet_open_memory(1, data[:-1], len(data) - 1, ctypes.byref(handle)) == 3


def test_fallback_ops_and_unbound_shapes_are_refused_by_name(profiled_model, tmp_path):
    import onnx

    path = tmp_path / "fallback.onnx"
    onnx.save(profiled_model(2, 8, 1024), path)  # a long smallest-TopK: a numpy fallback
    with pytest.raises(ExportError, match=r"numpy fallbacks \('best' \(TopK\)\)"):
        ember.export(path, tmp_path / "out")
    dynamic = tmp_path / "dynamic.onnx"
    onnx.save(profiled_model("batch", 8, 16), dynamic)
    with pytest.raises(ember.EmberError, match="batch"):
        ember.export(dynamic, tmp_path / "out2")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def test_names_become_safe_c_prefixes_and_string_literals():
    assert c_prefix("ResNet-18 v1.5") == "resnet_18_v1_5"
    assert c_prefix("3d-unet") == "model_3d_unet"
    for bad in ("", "ember", "em_x", "---"):
        with pytest.raises(ExportError):
            c_prefix(bad)
    literal = c_string_literal('a"\n*/\\é')
    assert literal == '"a\\042\\012\\052/\\134\\303\\251"'


def test_an_export_replaces_its_own_directory_only(tinynet_export, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ember.EmberError, match="notes.txt"):
        ember.export(TINYNET, mine, input_shapes={"input": (1, 3, 32, 32)})
    assert (mine / "notes.txt").read_text() == "keep me" and len(os.listdir(mine)) == 1
    again = tmp_path / "again"
    shutil.copytree(tinynet_export, again)
    ember.export(TINYNET, again, input_shapes={"input": (1, 3, 32, 32)})
    assert "[1, 3, 32, 32]" in (again / "README.md").read_text()


def test_cli_export(tmp_path, capsys):
    out = tmp_path / "cli"
    assert cli_main(["export", str(TINYNET), "-o", str(out), "--dim", "N=1",
                     "--name", "net"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert (out / "net.h").is_file() and (out / "libnet.so").is_file()
    assert cli_main(["export", str(TINYNET), "-o", str(tmp_path / "x"), "--target",
                     "riscv64-linux"]) != 0


def test_a_target_without_a_cross_compiler_says_what_to_install(monkeypatch, tmp_path):
    from ember.toolchain import compiler

    monkeypatch.setattr(compiler.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("PATH", str(tmp_path))  # no clang, no gcc
    compiler._find_compiler.cache_clear()
    try:
        with pytest.raises(ToolchainError, match="ziglang"):
            compiler.find_compiler(ember.Target.parse("aarch64"))
    finally:
        compiler._find_compiler.cache_clear()


def test_a_compiled_module_exports_its_current_shapes(tmp_path):
    module = ember.compile(TINYNET, input_shapes={"input": (1, 3, 32, 32)})
    image = np.random.default_rng(2).standard_normal((3, 3, 32, 32)).astype(np.float32)
    module(image)  # now batch 3 (run in blocks): the current shapes
    result = module.export(tmp_path / "net")
    lib = _api(result.directory, "tinynet")
    assert lib.tinynet_input_shape(0)[:4] == [3, 3, 32, 32]
    status, handle, _ = _open(lib, "tinynet", result.files["weights"])
    out = np.empty((3, 10), np.float32)
    inputs = (ctypes.c_void_p * 1)(image.ctypes.data)
    outputs = (ctypes.c_void_p * 1)(out.ctypes.data)
    assert status == 0 and lib.tinynet_run(handle, inputs, outputs) == 0
    np.testing.assert_allclose(out, module(image), rtol=1e-5, atol=1e-5)
    lib.tinynet_destroy(handle)
    with pytest.raises(ember.EmberError, match="needs the shape"):
        ember.compile(TINYNET).export(tmp_path / "x", input_shapes={})


def test_run_time_dims_through_the_c_api(sequence_path, tmp_path):
    directory = tmp_path / "seq"
    ember.export(sequence_path, directory, input_shapes={"x": (1, 20, 8)},
                 dynamic_dims=["seq"])
    lib = _api(directory, "seqnet")
    lib.seqnet_dim_name.restype = ctypes.c_char_p
    for kind in ("input", "output"):
        getattr(lib, f"seqnet_bound_{kind}_shape").restype = ctypes.POINTER(ctypes.c_int64)
        getattr(lib, f"seqnet_bound_{kind}_nbytes").restype = ctypes.c_size_t
    lib.seqnet_set_dims.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    assert lib.seqnet_num_dims() == 1 and lib.seqnet_dim_name(0) == b"seq"
    assert lib.seqnet_input_shape(0)[:3] == [1, -1, 8] and lib.seqnet_input_nbytes(0) == 0
    status, handle, _ = _open(lib, "seqnet", directory / "seqnet.weights")
    assert status == 0
    x = np.zeros((1, 20, 8), np.float32)
    y = np.zeros((1, 20, 8), np.float32)
    inputs = (ctypes.c_void_p * 1)(x.ctypes.data)
    outputs = (ctypes.c_void_p * 1)(y.ctypes.data)
    assert lib.seqnet_run(handle, inputs, outputs) == 1
    assert "call seqnet_set_dims first" in lib.seqnet_last_error().decode()
    for length in (16, 24, 31):  # the sizes the build traced at 20 serves
        dims = (ctypes.c_int64 * 1)(length)
        assert lib.seqnet_set_dims(handle, dims) == 0, lib.seqnet_last_error()
        assert lib.seqnet_bound_output_shape(handle, 0)[:3] == [1, length, 8]
        assert lib.seqnet_bound_output_nbytes(handle, 0) == length * 8 * 4
        x = np.random.default_rng(length).standard_normal((1, length, 8)).astype(np.float32)
        y = np.empty_like(x)
        inputs[0], outputs[0] = x.ctypes.data, y.ctypes.data
        assert lib.seqnet_run(handle, inputs, outputs) == 0
        np.testing.assert_allclose(y, reference(sequence_path, {"x": x})["y"], rtol=1e-5,
                                   atol=1e-6)
    for length, why in ((32, "the guard seq <= 31"), (15, "the guard seq >= 16"),
                        (0, "every dim must be in 1.."), (1 << 40, "every dim must be in 1..")):
        dims = (ctypes.c_int64 * 1)(length)
        assert lib.seqnet_set_dims(handle, dims) == 1
        message = lib.seqnet_last_error().decode()
        assert f"seq={length}" in message and why in message, message
    lib.seqnet_destroy(handle)
    record = __import__("json").loads((directory / "export.json").read_text())
    assert record["dims"] == [{"name": "seq", "sample": 20, "covered": [16, 31]}]
    assert record["inputs"][0]["axes"] == [1, {"dim": 0}, 8]


def test_example_program_takes_run_time_dims(sequence_path, tmp_path):
    directory = tmp_path / "seq"
    assert cli_main(["export", str(sequence_path), "-o", str(directory), "--dim", "seq=20",
                     "--dynamic", "seq"]) == 0
    program = compile_example(directory, "seqnet", tmp_path / "run_model")
    x = np.random.default_rng(7).standard_normal((1, 27, 8)).astype(np.float32)
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run([str(program), str(directory / "seqnet.weights"), "-d", "seq=27",
                             *write_inputs(tmp_path, [x]), "-o", str(out)], env={},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "output 0 'y' [1, 27, 8]" in result.stdout
    y = np.fromfile(out / "output0.bin", np.float32).reshape(1, 27, 8)
    np.testing.assert_allclose(y, reference(sequence_path, {"x": x})["y"], rtol=1e-5,
                               atol=1e-6)
    missing = subprocess.run([str(program), str(directory / "seqnet.weights")], env={},
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "give -d seq=SIZE" in missing.stderr
    outside = subprocess.run([str(program), str(directory / "seqnet.weights"), "-d",
                              "seq=99"], env={}, capture_output=True, text=True, timeout=60)
    assert outside.returncode == 1 and "seq=99 is outside" in outside.stderr


def test_the_api_and_kernels_under_address_and_undefined_behaviour_sanitizers(
        two_way_path, sequence_path, tmp_path):
    """The C API (weights checks, SHA-256, guards, index checks, misaligned outputs) and the
    kernels, built with -fsanitize=address,undefined and run by the example program."""
    from ember.driver import BuildOptions, build_graph
    from ember.frontend.onnx import import_onnx
    from ember.package.export import export_build
    from ember.toolchain.compiler import SANITIZE_FLAGS

    sanitized = BuildOptions(sanitize=True)
    two_way = export_build(build_graph(import_onnx(two_way_path), None, sanitized),
                           tmp_path / "two_way", "two_way", sanitize=True)
    program = compile_example(two_way.directory, "two_way", tmp_path / "run_two_way",
                              extra=list(SANITIZE_FLAGS))
    feeds = two_way_inputs()
    environment = {"ASAN_OPTIONS": "detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    out = tmp_path / "out"
    out.mkdir()
    run = subprocess.run([str(program), str(two_way.files["weights"]),
                          *write_inputs(tmp_path, [feeds["x"], feeds[HOSTILE_INPUT]]),
                          "-o", str(out), "-r", "3"],
                         env=environment, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "runtime error" not in run.stderr, run.stderr
    rows = np.fromfile(out / "output1.bin", np.float32).reshape(3, 3)
    np.testing.assert_array_equal(rows, reference(two_way_path, feeds)["rows"])
    bad = subprocess.run([str(program), str(two_way.files["weights"]), *write_inputs(
        tmp_path, [feeds["x"], np.array([0, 7, 1], np.int64)])], env=environment,
        capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "index input was out of range" in bad.stderr, bad.stderr

    from ember.api import _traced_for_export

    build, dims = _traced_for_export(import_onnx(sequence_path), sanitized,
                                     {"x": (1, 20, 8)}, ["seq"])
    seq = export_build(build, tmp_path / "seq", "seqnet", dims=dims, sanitize=True)
    program = compile_example(seq.directory, "seqnet", tmp_path / "run_seq",
                              extra=list(SANITIZE_FLAGS))
    for length, status in ((17, 0), (31, 0), (40, 1)):
        run = subprocess.run([str(program), str(seq.files["weights"]), "-d", f"seq={length}"],
                             env=environment, capture_output=True, text=True, timeout=300)
        assert run.returncode == status and "runtime error" not in run.stderr, run.stderr


@pytest.mark.parametrize("static", [False, True], ids=["shared", "static"])
def test_weights_linked_into_the_library(tmp_path, static):
    directory = tmp_path / "embedded"
    assert cli_main(["export", str(TINYNET), "-o", str(directory), "--dim", "N=2",
                     "--embed-weights"]) == 0
    assert not list(directory.glob("*.weights"))
    program = compile_example(directory, "tinynet", tmp_path / "run_model", static=static)
    image = _image()
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run([str(program), "-e", *write_inputs(tmp_path, [image]), "-o",
                             str(out)], env={}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    logits = np.fromfile(out / "output0.bin", np.float32).reshape(BATCH, 10)
    np.testing.assert_allclose(logits, reference(TINYNET, {"input": image})["logits"],
                               rtol=1e-4, atol=1e-4)


def test_a_library_without_embedded_weights_says_so(tinynet_export):
    lib = _api(tinynet_export, "tinynet")
    handle = ctypes.c_void_p()
    lib.tinynet_open_embedded.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    assert lib.tinynet_open_embedded(1, ctypes.byref(handle)) == 3
    assert "no embedded weights" in lib.tinynet_last_error().decode() and not handle.value


@pytest.mark.parametrize("target, feature", [("x86_64-avx2-linux", "avx2"),
                                             ("x86_64-avx512-linux", "avx512f")])
def test_a_library_for_a_newer_cpu_refuses_to_open_instead_of_crashing(tmp_path, target,
                                                                       feature):
    if ember.Target.native().arch != "x86_64":
        pytest.skip("an x86-64 host runs the x86-64 exports")
    result = ember.export(TINYNET, tmp_path / "net", target=target,
                          input_shapes={"input": (BATCH, 3, 32, 32)})
    program = compile_example(result.directory, "tinynet", tmp_path / "run_model",
                              static=True)
    image = _image()
    out = tmp_path / "out"
    out.mkdir()
    run = subprocess.run([str(program), str(result.files["weights"]),
                          *write_inputs(tmp_path, [image]), "-o", str(out)], env={},
                         capture_output=True, text=True, timeout=120)
    if ember.Target.native().has(feature):
        assert run.returncode == 0, run.stderr
        logits = np.fromfile(out / "output0.bin", np.float32).reshape(BATCH, 10)
        np.testing.assert_allclose(logits, reference(TINYNET, {"input": image})["logits"],
                                   rtol=1e-4, atol=1e-4)
    else:  # a clear error and a clean exit, not an illegal instruction
        assert run.returncode == 1, (run.returncode, run.stderr)
        assert "is built for x86-64-v" in run.stderr and "this CPU is not one" in run.stderr


def test_a_compiled_module_exports_run_time_dims_and_embedded_weights(sequence_path,
                                                                      tmp_path):
    module = ember.compile(sequence_path)
    x = np.random.default_rng(8).standard_normal((1, 22, 8)).astype(np.float32)
    module(x)
    result = module.export(tmp_path / "seq", dynamic_dims=["seq"], embed_weights=True)
    assert "weights" not in result.files
    lib = _api(result.directory, "seqnet")
    lib.seqnet_open_embedded.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    lib.seqnet_set_dims.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    handle = ctypes.c_void_p()
    assert lib.seqnet_open_embedded(1, ctypes.byref(handle)) == 0
    for length in (17, 29):
        assert lib.seqnet_set_dims(handle, (ctypes.c_int64 * 1)(length)) == 0
        x = np.random.default_rng(length).standard_normal((1, length, 8)).astype(np.float32)
        y = np.empty_like(x)
        assert lib.seqnet_run(handle, (ctypes.c_void_p * 1)(x.ctypes.data),
                              (ctypes.c_void_p * 1)(y.ctypes.data)) == 0
        np.testing.assert_allclose(y, module(x), rtol=1e-5, atol=1e-6)
    lib.seqnet_destroy(handle)
