"""Compiler discovery, flags, errors, the compile cache and the exported C ABI."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest
from codegen_cases import aligned_empty, case_row_sum, case_vector_tail, run_case

from ember.codegen import CModule, CodegenError, generate_c, kernel_symbol
from ember.core.dtypes import DType
from ember.core.errors import EmberError
from ember.core.target import Target
from ember.ir.loop import Buffer, For, ForKind, Load, PrimFunc, Store, Var, const
from ember.toolchain import (CompileCache, ToolchainError, compile_flags, compile_shared,
                             find_compiler, stats)
from ember.toolchain.cache import default_cache_dir


def unique_source(body: str = "") -> str:
    """A fresh source (a cache miss) exporting one function."""
    return (f"/* {uuid.uuid4()} */\n"
            "__attribute__((visibility(\"default\"))) int ember_answer(void) { return 42; }\n"
            + body)


# --------------------------------------------------------------------------- compiler
def test_find_compiler_prefers_cc_env(monkeypatch):
    monkeypatch.setenv("CC", "gcc")
    compiler = find_compiler(Target.native())
    assert compiler.argv == ("gcc",) and compiler.explicit and compiler.family == "gcc"
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(ToolchainError, match="not an executable"):
        find_compiler(Target.native())


def test_no_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ToolchainError, match="ziglang"):
        find_compiler(Target.native())


def test_flags_are_fast_but_ieee(monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    compiler = find_compiler(Target.native())
    flags = compile_flags(compiler, Target.native())
    assert {"-O3", "-std=c11", "-fPIC", "-shared", "-march=native"} <= set(flags)
    assert "-ffast-math" not in flags and "-ffp-contract=fast" in flags
    # compiled models run on their own pthreads pool, not OpenMP's (c_threads.py)
    assert "-pthread" in flags and "-fopenmp" not in flags
    avx2 = compile_flags(compiler, Target.parse("x86_64-avx2"), sanitize=True)
    assert "-march=x86-64-v3" in avx2
    assert "-fsanitize=address,undefined,float-cast-overflow" in avx2
    if Target.native().arch == "x86_64" and compiler.family == "gcc":
        with pytest.raises(ToolchainError, match="cannot compile for aarch64"):
            compile_flags(compiler, Target.parse("aarch64"))


def test_compile_error_keeps_source_and_reports_stderr(cache):
    with pytest.raises(ToolchainError) as info:
        compile_shared(unique_source("int broken(void) { return undeclared; }\n"),
                       Target.native(), cache=cache)
    err = info.value
    assert isinstance(err, EmberError)
    assert "undeclared" in err.stderr and "undeclared" in str(err)
    assert err.source_path is not None and err.source_path.is_file()
    assert "int broken" in err.source_path.read_text()


# --------------------------------------------------------------------------- cache
def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "a"))
    assert default_cache_dir() == tmp_path / "a"
    monkeypatch.delenv("EMBER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "ember"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "ember"


def test_second_compile_is_a_cache_hit(cache):
    source = unique_source()
    compiles = stats.compiles
    first = compile_shared(source, Target.native(), cache=cache)
    assert stats.compiles == compiles + 1
    mtime = first.stat().st_mtime_ns
    hits = stats.cache_hits
    second = compile_shared(source, Target.native(), cache=cache)
    assert second == first and second.stat().st_mtime_ns == mtime
    assert stats.compiles == compiles + 1 and stats.cache_hits == hits + 1
    # other flags or another target are other binaries
    third = compile_shared(source, Target.native(), opt_level=2, cache=cache)
    assert third != first and stats.compiles == compiles + 2
    assert ctypes.CDLL(str(first)).ember_answer() == 42
    assert not list(cache.root.glob(".*.tmp*")), "temporary files left behind"


def test_concurrent_processes_compile_the_same_source(cache_dir):
    """Two processes missing the cache at once both succeed and agree on the library."""
    root = cache_dir / "concurrent"
    source = unique_source("".join(f"int f{k}(int x) {{ return x * {k}; }}\n"
                                   for k in range(300)))  # slow enough to overlap
    script = textwrap.dedent("""
        import sys
        from ember.core.target import Target
        from ember.toolchain import CompileCache, compile_shared
        print(compile_shared(sys.stdin.read(), Target.native(), cache=CompileCache(sys.argv[1])))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in procs:
        p.stdin.write(source)
        p.stdin.close()
    results = [(p.wait(timeout=120), p.stdout.read().strip(), p.stderr.read()) for p in procs]
    assert all(code == 0 for code, _, _ in results), results
    paths = {path for _, path, _ in results}
    assert len(paths) == 1
    assert ctypes.CDLL(paths.pop()).ember_answer() == 42
    assert not list(root.glob(".*.tmp*"))


def test_unwritable_cache_compiles_without_it_and_says_so(tmp_path):
    """The cache is an optimization: one that cannot be made warns (naming it and what to do)
    and the library is built in a temporary directory instead
    (tests/codegen/test_write_failures.py covers full and read-only disks)."""
    from ember.toolchain import CacheWarning

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.warns(CacheWarning, match=r"file/sub cannot be written .*EMBER_CACHE_DIR"):
        path = compile_shared(unique_source(), Target.native(),
                              cache=CompileCache(blocker / "sub"))
    assert ctypes.CDLL(str(path)).ember_answer() == 42
    assert not path.is_relative_to(blocker)


def test_uncached_build():
    path = compile_shared(unique_source(), Target.native(), use_cache=False)
    try:
        assert ctypes.CDLL(str(path)).ember_answer() == 42
    finally:
        shutil.rmtree(path.parent)


# --------------------------------------------------------------------------- ABI
ENTRY = """
static int ember_helper_not_exported(void) { return 1; }
int ember_also_hidden(void) { return 2; }

EMBER_EXPORT int ember_run(const float* x, float* y) {
  vector_tail(x, y);
  return ember_helper_not_exported() + ember_also_hidden() - 3;
}
"""


def test_entry_point_exports_only_what_is_asked(cache):
    case = case_vector_tail(64)
    module = CModule([case.func], Target.native(), extra_source=ENTRY, exports=["ember_run"])
    source = generate_c(module)
    assert "static void vector_tail(" in source
    lib = ctypes.CDLL(str(compile_shared(source, Target.native(), cache=cache)))
    for hidden in ("vector_tail", "ember_also_hidden", "ember_helper_not_exported"):
        with pytest.raises(AttributeError):
            getattr(lib, hidden)
    x = np.linspace(-3, 3, 1000, dtype=np.float32)
    y = np.zeros_like(x)
    lib.ember_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    # the kernel assumes 64-byte aligned buffers; numpy only guarantees 16
    xa, ya = aligned_empty(x.shape, x.dtype), aligned_empty(y.shape, y.dtype)
    xa[:] = x
    assert lib.ember_run(xa.ctypes.data, ya.ctypes.data) == 0
    np.testing.assert_allclose(ya, np.where(x > 0, 2 * x, np.exp(x)) + 1, rtol=1e-6)


def test_exports_must_exist():
    case = case_vector_tail(64)
    with pytest.raises(CodegenError, match="ember_missing"):
        generate_c(CModule([case.func], Target.native(), exports=["ember_missing"]))
    with pytest.raises(CodegenError, match="EMBER_EXPORT"):
        generate_c(CModule([case.func], Target.native(), exports=["ember_run"],
                           extra_source="int ember_run(void) { return 0; }"))


def test_odd_kernel_names_get_safe_symbols(cache):
    x = Buffer("x", DType.INT32, (4,))
    i = Var("i")
    func = PrimFunc("block.0/conv#1", (x,), For(i, const(0), const(4), ForKind.SERIAL,
                                              Store(x, i, Load(x, i) + const(1, DType.INT32))))
    symbol = kernel_symbol(func)
    assert symbol.isidentifier() and symbol.startswith("block_0_conv_1_")
    for reserved in ("int", "exp", "memcpy", "em_add_i64"):
        assert kernel_symbol(PrimFunc(reserved, (), func.body)) != reserved
    lib = ctypes.CDLL(str(compile_shared(generate_c(CModule([func], Target.native(),
                                                            exports=[func.name])),
                                         Target.native(), cache=cache)))
    data = aligned_empty((4,), np.int32)
    data[:] = [1, 2, 3, -1]
    getattr(lib, symbol)(ctypes.c_void_p(data.ctypes.data))
    assert data.tolist() == [2, 3, 4, 0]


def test_thread_count_controls_parallel_loops(cases_lib, cache):
    """ember_set/get_num_threads on the pool, and a serial build without threads."""
    lib = cases_lib
    lib.ember_set_num_threads(3)
    assert lib.ember_get_num_threads() == 3
    run_case(lib, case_row_sum(64))
    lib.ember_set_num_threads(0)
    assert lib.ember_get_num_threads() >= 1
    case = case_row_sum(64)
    serial = compile_shared(generate_c(CModule([case.func], Target.native(),
                                               exports=["row_sum"])),
                            Target.native(), extra_flags=["-DEMBER_NO_THREADS"], cache=cache)
    serial_lib = ctypes.CDLL(str(serial))
    serial_lib.ember_set_num_threads(4)
    assert serial_lib.ember_get_num_threads() == 1
    run_case(serial_lib, case)


@pytest.mark.parametrize("name", ["x86_64", "x86_64-avx2"])
def test_portable_targets_run_on_this_host(name, cache):
    target = Target.parse(name)
    if target.arch != Target.native().arch or not Target.native().has(*target.features):
        pytest.skip(f"host cannot run {name}")
    case = case_vector_tail(64)
    source = generate_c(CModule([case.func], target, exports=["vector_tail"]))
    run_case(ctypes.CDLL(str(compile_shared(source, target, cache=cache))), case)



@pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX")
def test_a_compiler_past_its_time_is_killed_with_its_children(tmp_path, monkeypatch):
    """``cc`` is a driver that runs ``cc1``: on timeout the whole process group is killed,
    not the driver alone (which left a runaway ``cc1`` holding a core)."""
    import os
    import time

    import ember.toolchain.compiler as compiler_module

    marker = tmp_path / "child.pid"
    fake = tmp_path / "fake-cc"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        sleep 300 &
        echo $! > {marker}
        wait
        """))
    fake.chmod(0o755)
    monkeypatch.setattr(compiler_module, "_TIMEOUT_S", 1)
    fake_compiler = compiler_module.Compiler(argv=(str(fake),), family="gcc", identity="fake")
    with pytest.raises(ToolchainError, match="took longer than 1 s"):
        compiler_module.run_compiler(fake_compiler, [], [tmp_path / "a.c"], tmp_path / "a.o")
    child = int(marker.read_text())

    def alive() -> bool:
        # (a killed process is a zombie until whoever adopted it reaps it: that is dead)
        try:
            os.kill(child, 0)
            with open(f"/proc/{child}/stat") as stat:
                return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (ProcessLookupError, FileNotFoundError):
            return False
        except OSError:
            return True

    for _ in range(50):  # the kill is asynchronous: give it a moment
        if not alive():
            break
        time.sleep(0.05)
    else:
        os.kill(child, 9)
        pytest.fail("the compiler's child process outlived the timeout")
