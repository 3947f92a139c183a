"""Finding a C compiler and turning generated C into a shared library.

ember needs exactly one external tool, a C compiler.  :func:`find_compiler` takes ``$CC``, else
the first of ``cc``, ``gcc``, ``clang`` on ``PATH``, else the ``ziglang`` Python package
(``python -m ziglang cc``: a pip-installable Clang, for machines without a compiler).  For
another architecture than the host's (``ember export --target aarch64-linux``, wasm32) it
takes the ``ziglang`` package first, which carries every target's C library, else ``clang``
(which links for another target only with that target's libraries installed).

:func:`compile_shared` builds with ``-O3 -std=c11 -fPIC -shared`` plus the target's ``-march``
flags, OpenMP when the compiler has a working one (probed once per compiler), and
``-ffp-contract=fast -fno-math-errno`` -- but never ``-ffast-math``: models rely on NaN and
infinities behaving as IEEE 754 says.  (``-fno-trapping-math`` is not global either: it
made the Clip epilogue of small-K GEMMs scalar and MobileNetV2 1.6x slower.  Only the kernel
units that call the fast exp/tanh/erf/sigmoid get it, which GCC needs to vectorize them; see
``ember.codegen.c_fast_math.UNIT_FLAGS``.)  Results are cached (:mod:`ember.toolchain.cache`).

``sanitize=True`` builds with AddressSanitizer and UBSan (float-cast-overflow included, which
GCC's ``undefined`` group leaves out), aborting on the first error.  Such a
library can only be loaded by a process that has the ASan runtime loaded first: run it in a
subprocess with ``LD_PRELOAD=sanitizer_preload()`` and ``ASAN_OPTIONS=detect_leaks=0`` (the
Python interpreter itself "leaks" by ASan's standards).
"""

from __future__ import annotations

import errno
import functools
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from ember.core.errors import EmberError
from ember.core.target import Target
from ember.toolchain.cache import (CacheError, CacheWriteError, CachedFile, CompileCache,
                                   cache_key, fallback_cache, file_sha256)
from ember.toolchain.disk import describe_write_failure, remedy

T = TypeVar("T")

_TIMEOUT_S = 900
# GCC's "undefined" leaves out float-cast-overflow (a float converted to an integer type
# that cannot hold it: NaN, infinities, out of range), which Clang's includes: ask for it.
SANITIZE_FLAGS = ("-fsanitize=address,undefined,float-cast-overflow",
                  "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g")
# aarch64 extensions whose LLVM feature name (what zig's -mcpu takes) differs from GCC's.
_ZIG_AARCH64_FEATURES = {"fp16": "fullfp16", "simd": "neon"}
_ZIG_TRIPLES = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu",
                "wasm32": "wasm32-wasi"}


class ToolchainError(EmberError):
    """No usable compiler, or the compiler rejected the source.

    ``stderr`` is the compiler's output, ``source_path`` the C file it was given (kept on disk
    for inspection), ``command`` the command line.
    """

    def __init__(self, message: str, stderr: str = "", source_path: Path | None = None,
                 command: Sequence[str] = ()):
        self.stderr = stderr
        self.source_path = source_path
        self.command = list(command)
        details = [message]
        if source_path is not None:
            details.append(f"source kept at {source_path}")
        if command:
            details.append(f"command: {shlex.join(command)}")
        if stderr:
            details.append("compiler output:\n" + _tail(stderr))
        super().__init__("\n".join(details))


def _tail(text: str, lines: int = 60) -> str:
    kept = text.rstrip().splitlines()
    skipped = len(kept) - lines
    return "\n".join(([f"... ({skipped} lines skipped)"] if skipped > 0 else []) + kept[-lines:])


@dataclass(frozen=True)
class Compiler:
    """A C compiler command: ``argv`` (e.g. ``("gcc",)``), its ``family`` (gcc, clang or zig),
    ``identity`` (first line of ``--version``) and whether the user chose it via ``$CC``."""

    argv: tuple[str, ...]
    family: str
    identity: str
    explicit: bool = False

    def target_flags(self, target: Target) -> list[str]:
        """Flags selecting ``target``'s architecture when it is not the host's."""
        if target.kind == "native" or target.arch == Target.native().arch:
            return []
        if self.family == "clang":
            return [f"--target={target.triple}"]
        if self.family == "zig":
            return ["-target", _ZIG_TRIPLES.get(target.arch, target.triple)]
        if self.explicit:
            return []  # $CC names a cross compiler; trust it
        raise ToolchainError(
            f"{self.identity!r} cannot compile for {target.triple}: set CC to a cross "
            "compiler or clang, or `pip install ziglang`")

    def cpu_flags(self, target: Target) -> list[str]:
        """``target``'s instruction-set flags as this compiler spells them.  GCC and Clang
        take ``target.march``; zig's driver names CPUs its own way (``-mcpu=generic+neon``,
        ``-mcpu=x86_64_v3``) and refuses ``-march=armv8-a``."""
        if self.family != "zig":
            return list(target.march)
        flags = []
        for flag in target.march:
            if flag.startswith("-march=armv8"):  # armv8[.N]-a[+ext+...]
                extensions = flag.split("+")[1:]
                flags.append("-mcpu=" + "+".join(
                    ["generic", *(_ZIG_AARCH64_FEATURES.get(e, e) for e in extensions)]))
            elif flag.startswith("-march=x86-64"):
                flags.append("-mcpu=" + flag[len("-march="):].replace("-", "_"))
            elif flag == "-mtune=generic":
                continue
            else:
                flags.append(flag)
        return flags


@dataclass
class ToolchainStats:
    """Process-wide counters (tests use them to tell cache hits from compiles)."""

    compiles: int = 0  # libraries built by the compiler (or linked from objects)
    cache_hits: int = 0  # libraries found in the cache
    objects_compiled: int = 0  # translation units compiled to objects (ember.toolchain.units)
    object_hits: int = 0  # objects found in the cache


stats = ToolchainStats()


def find_compiler(target: Target | None = None) -> Compiler:
    """The C compiler to use for ``target`` (see the module docstring for the search order)."""
    return _find_compiler(os.environ.get("CC", ""), os.environ.get("PATH", ""),
                          target.arch if target is not None else "")


@functools.lru_cache(maxsize=None)
def _find_compiler(cc: str, path: str, arch: str) -> Compiler:
    del path  # part of the cache key only: a changed PATH may find another compiler
    if cc.strip():
        argv = tuple(shlex.split(cc))
        if shutil.which(argv[0]) is None:
            raise ToolchainError(f"$CC is {cc!r}, but {argv[0]!r} is not an executable")
        return _identify(argv, explicit=True)
    zig = importlib.util.find_spec("ziglang") is not None
    names: tuple[str, ...] = ("cc", "gcc", "clang")
    if arch and arch != Target.native().arch:
        # Cross-compiling: gcc compiles only for the host, and clang links for another
        # target only with that target's C library installed; zig brings every one it knows.
        if zig:
            return _identify((sys.executable, "-m", "ziglang", "cc"))
        names = ("clang",)
    for name in names:
        found = shutil.which(name)
        if found:
            return _identify((found,))
    if zig:
        return _identify((sys.executable, "-m", "ziglang", "cc"))
    raise ToolchainError(
        "no C compiler found: set $CC, install gcc or clang (e.g. `apt-get install gcc`), or "
        "`pip install ziglang` for a self-contained one")


def _identify(argv: tuple[str, ...], explicit: bool = False) -> Compiler:
    try:
        result = subprocess.run([*argv, "--version"], capture_output=True, text=True,
                                timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ToolchainError(f"cannot run C compiler {shlex.join(argv)}: {err}") from None
    if result.returncode != 0:
        raise ToolchainError(f"C compiler {shlex.join(argv)} --version failed",
                             result.stderr, command=[*argv, "--version"])
    identity = (result.stdout.strip().splitlines() or [shlex.join(argv)])[0]
    text = result.stdout.lower()
    family = "zig" if "ziglang" in argv else "clang" if "clang" in text else "gcc"
    return Compiler(argv, family, identity, explicit)


# --------------------------------------------------------------------------- compiling
def compile_flags(compiler: Compiler, target: Target, opt_level: int = 3,
                  sanitize: bool = False, extra_flags: Sequence[str] = ()) -> list[str]:
    """Every flag of a build, in order, except the input and output files."""
    flags = [f"-O{opt_level}", "-std=c11", *compiler.target_flags(target),
             *compiler.cpu_flags(target),
             "-ffp-contract=fast", "-fno-math-errno", "-fvisibility=hidden"]
    if compiler.family == "gcc":  # wide vectors in static helpers: no ABI to keep stable
        flags.append("-Wno-psabi")
    if target.arch == "wasm32":
        flags += ["-nostartfiles", "-Wl,--no-entry", "-Wl,--export-dynamic"]
    else:
        # parallel loops run on the library's own pthreads pool (ember/codegen/c_threads.py)
        flags += ["-fPIC", "-shared", "-pthread"]
    if sanitize:
        flags += SANITIZE_FLAGS
    return flags + list(extra_flags)


def compile_shared(source: str, target: Target, opt_level: int = 3, sanitize: bool = False,
                   extra_flags: Sequence[str] = (), *,
                   cache: CompileCache | None = None, use_cache: bool = True) -> Path:
    """Compile C ``source`` into a shared library for ``target`` and return its path.

    With ``use_cache`` (the default) an identical earlier build is returned without running
    the compiler, after its digest was checked; ``cache`` picks a cache other than the default
    directory.
    """
    return build_library(source, target, opt_level, sanitize, extra_flags, cache=cache,
                         use_cache=use_cache).path


def build_library(source: str, target: Target, opt_level: int = 3, sanitize: bool = False,
                  extra_flags: Sequence[str] = (), *, cache: CompileCache | None = None,
                  use_cache: bool = True) -> CachedFile:
    """:func:`compile_shared`, also giving the SHA-256 of the library bytes it verified (so a
    caller that copies the file can check that the copy is what was verified)."""
    compiler = find_compiler(target)
    flags = compile_flags(compiler, target, opt_level, sanitize, extra_flags)
    suffix = ".wasm" if target.arch == "wasm32" else ".so"
    if not use_cache:
        try:
            workdir = Path(tempfile.mkdtemp(prefix="ember-build-"))
            src = workdir / "module.c"
            src.write_text(source, encoding="utf-8")
        except OSError as error:
            raise ToolchainError(f"cannot write the C source: "
                                 f"{describe_write_failure(error, 'a temporary file')}; "
                                 f"{remedy(error, elsewhere='set TMPDIR to another directory')}"
                                 ) from None
        out = workdir / f"module{suffix}"
        run_compiler(compiler, flags, [src], out)
        stats.compiles += 1
        return CachedFile(out, file_sha256(out))
    cache = checked_cache(cache if cache is not None else CompileCache())
    key = cache_key(source, [*flags, json.dumps(target.to_dict(), sort_keys=True)],
                    compiler.identity)
    hit = cache.lookup(key, suffix)
    if hit is not None:
        stats.cache_hits += 1
        return hit

    def build_in(into: CompileCache) -> CachedFile:
        src = cache_write(into, lambda: into.write_text(key, ".c", source))
        temp = cache_write(into, lambda: into.temp_path(key, suffix))
        try:
            cache_write(into, lambda: run_compiler(compiler, flags, [src], temp))
            stats.compiles += 1
            return cache_write(into, lambda: into.commit(temp, key, suffix))
        finally:
            temp.unlink(missing_ok=True)

    return with_fallback(cache, build_in)


class CacheWriteFailed(Exception):
    """A write into the compile cache ``cache`` failed with ``error`` (internal: the build is
    redone in :func:`fallback_cache`, see :func:`with_fallback`)."""

    def __init__(self, cache: CompileCache, error: OSError):
        super().__init__(str(error))
        self.cache = cache
        self.error = error


# What a compiler or linker prints when it cannot write its output (untranslated: ember runs
# it in the user's locale, so a translated message falls through to the compiler's error).
_WRITE_FAILURES = {"No space left on device": errno.ENOSPC,
                   "Disk quota exceeded": errno.EDQUOT,
                   "Read-only file system": errno.EROFS}


def cache_write(cache: CompileCache, action: Callable[[], T]) -> T:
    """Run ``action``, a write into ``cache`` (or a compile whose output goes there); a
    failure to write becomes :class:`CacheWriteFailed`, so that the build falls back."""
    try:
        return action()
    except CacheWriteError as error:
        raise CacheWriteFailed(cache, error.cause) from None
    except OSError as error:
        raise CacheWriteFailed(cache, error) from None
    except ToolchainError as error:
        for text, code in _WRITE_FAILURES.items():
            if text in error.stderr:
                raise CacheWriteFailed(cache, OSError(code, os.strerror(code))) from None
        raise


def with_fallback(cache: CompileCache, build: Callable[[CompileCache], T]) -> T:
    """``build(cache)``; when writing the cache fails, ``build`` again in the temporary cache
    of :func:`fallback_cache` (with a warning), and when that fails too, a ToolchainError
    naming both failures."""
    try:
        return build(cache)
    except CacheWriteFailed as failure:
        if cache.temporary:  # the fallback itself: there is nowhere else
            raise _nowhere_to_write(None, failure.error, failure.error) from None
        fallback = usable_fallback(cache, failure.error)
        try:
            return build(fallback)
        except CacheWriteFailed as again:
            raise _nowhere_to_write(cache, failure.error, again.error) from None


def checked_cache(cache: CompileCache) -> CompileCache:
    """``cache``, once its directory and secret are checked (made if missing).  A cache that
    cannot be trusted is a ToolchainError saying how to choose another; one that cannot be
    written gives way to :func:`fallback_cache` (a warning, not an error)."""
    try:
        cache.secret  # noqa: B018 -- reading it checks the directory and makes the secret
    except CacheWriteError as error:
        return usable_fallback(cache, error.cause)
    except CacheError as error:
        raise ToolchainError(str(error)) from None
    return cache


def usable_fallback(cache: CompileCache, error: OSError) -> CompileCache:
    """The fallback of ``cache`` (which failed with ``error``), checked; a ToolchainError
    naming both failures when it cannot be made either."""
    try:
        fallback = fallback_cache(cache, error)
        fallback.secret  # noqa: B018 -- makes the directory's secret
    except CacheWriteError as again:
        raise _nowhere_to_write(cache, error, again.cause) from None
    except OSError as again:
        raise _nowhere_to_write(cache, error, again) from None
    return fallback


def _nowhere_to_write(cache: CompileCache | None, error: OSError, again: OSError
                      ) -> "ToolchainError":
    """Neither the compile cache (None: it could not be made at all) nor a temporary
    directory can be written."""
    in_temp = describe_write_failure(again, "a temporary directory", tempfile.gettempdir())
    in_cache = describe_write_failure(error, "the compile cache", cache.root) + ", and " \
        if cache is not None else ""
    return ToolchainError(
        f"cannot write the compiled code: {in_cache}{in_temp}; "
        + remedy(again, elsewhere="choose other directories: EMBER_CACHE_DIR sets the "
                                  "compile cache, TMPDIR the temporary directory"))


def _run_in_own_group(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run(command)`` with the output captured, in a process group of its own
    that is killed whole on timeout: ``cc`` is a driver, and killing it alone (what
    ``subprocess.run`` does) left its ``cc1`` compiling for as long as it liked, holding a
    core and gigabytes of memory after ember had given up on it."""
    if os.name != "posix":
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except OSError:
                process.kill()
            process.communicate()
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def run_compiler(compiler: Compiler, flags: Sequence[str], inputs: Sequence[Path], out: Path,
                 libraries: Sequence[str] = ("-lm",)) -> None:
    """Run ``compiler`` on ``inputs`` (C sources or objects) to write ``out``; a failure
    raises :class:`ToolchainError` with the compiler's output and the first input's path."""
    src = inputs[0]
    command = [*compiler.argv, *flags, "-o", str(out), *map(str, inputs), *libraries]
    try:
        result = _run_in_own_group(command, _TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"the C compiler took longer than {_TIMEOUT_S} s",
                             source_path=src, command=command) from None
    except OSError as err:
        raise ToolchainError(f"cannot run the C compiler: {err}", source_path=src,
                             command=command) from None
    if result.returncode != 0:
        raise ToolchainError(f"C compilation failed (exit status {result.returncode})",
                             result.stderr or result.stdout, src, command)
    try:
        produced = out.stat().st_size > 0
    except OSError:
        produced = False
    if not produced:
        # Not a cache problem: the command "succeeded" without doing its job (CC=/bin/true,
        # a wrapper script that swallows the compile).
        chosen = (f"$CC is {os.environ.get('CC', '')!r}: point CC at a C compiler such as "
                  f"gcc or clang, or unset it" if compiler.explicit else
                  "check that it is a working C compiler, or choose one with CC")
        raise ToolchainError(f"the C compiler {shlex.join(compiler.argv)} exited with status 0 "
                             f"but produced no library or object file (expected {out}); "
                             f"{chosen}", result.stderr or result.stdout, src, command)


def openmp_supported(compiler: Compiler, target: Target) -> bool:
    """Whether ``compiler`` compiles and links ``-fopenmp`` shared libraries (probed once).
    Compiled models do not use OpenMP (they own their threads); measurement programs such
    as ``ember.profile.peak`` do."""
    return _probe_openmp(compiler, tuple(compiler.target_flags(target)))


_OPENMP_PROBE = """#include <omp.h>
int ember_probe(void) {
  int n = 0;
#pragma omp parallel reduction(+:n)
  n += omp_get_num_threads() > 0;
  return n;
}
"""


@functools.lru_cache(maxsize=None)
def _probe_openmp(compiler: Compiler, target_flags: tuple[str, ...]) -> bool:
    with tempfile.TemporaryDirectory(prefix="ember-omp-") as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(_OPENMP_PROBE, encoding="utf-8")
        command = [*compiler.argv, *target_flags, "-fopenmp", "-fPIC", "-shared",
                   "-o", str(Path(tmp) / "probe.so"), str(src)]
        try:
            result = subprocess.run(command, capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return result.returncode == 0


# --------------------------------------------------------------------------- sanitizers
def sanitizer_preload(compiler: Compiler | None = None) -> str:
    """Path of the ASan runtime to put in ``LD_PRELOAD`` for a sanitized library."""
    compiler = compiler or find_compiler()
    names = ["libasan.so"]
    if compiler.family != "gcc":
        arch = Target.native().arch
        names = [f"libclang_rt.asan-{arch}.so", "libclang_rt.asan.so", *names]
    for name in names:
        try:
            result = subprocess.run([*compiler.argv, f"-print-file-name={name}"],
                                    capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        path = result.stdout.strip()
        if result.returncode == 0 and os.path.isabs(path) and os.path.isfile(path):
            return os.path.realpath(path)
    raise ToolchainError(f"the ASan runtime ({' or '.join(names)}) of {compiler.identity!r} "
                         "was not found; install it (Debian: libasan8 / libclang-rt-dev)")
