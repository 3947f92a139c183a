"""Building one shared library from many C translation units, in parallel, cached per unit.

A model's kernels are separate units (``ember.codegen.c.generate_units``).  One C compiler
process over the whole model took most of a build (9 of ResNet-18's 12 s); here each unit is
an object file of its own, compiled by as many compiler processes as the machine has cores,
and the objects are linked into the library.  Every object is a cache entry keyed by its
source, flags and compiler, like the libraries (:mod:`ember.toolchain.cache`): a kernel that
two models share -- or that one model repeats -- is compiled once, and a model that changes
one kernel recompiles that kernel only.  Objects are verified against their digests before
they are linked, as libraries are before they are loaded.

The library itself is cached too, under a key over its objects' keys and the link flags, so
building a model a second time runs no compiler at all.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

from ember.core.target import Target
from ember.toolchain.cache import CachedFile, CompileCache, cache_key
from ember.toolchain.compiler import (Compiler, ToolchainError, compile_flags, find_compiler,
                                      run_compiler, stats)

OBJECT_SUFFIX = ".o"


@dataclass(frozen=True)
class UnitSource:
    """A translation unit and the flags it needs beyond the library's (they join its key)."""

    text: str
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Unit:
    key: str
    source: str
    flags: tuple[str, ...]


def compile_jobs() -> int:
    """How many compiler processes run at once: ``$EMBER_COMPILE_JOBS``, else the number of
    cores this process may run on."""
    explicit = os.environ.get("EMBER_COMPILE_JOBS", "").strip()
    if explicit:
        try:
            jobs = int(explicit)
        except ValueError:
            raise ToolchainError(f"EMBER_COMPILE_JOBS is {explicit!r}; give a positive "
                                 "number of compiler processes") from None
        if jobs < 1:
            raise ToolchainError(f"EMBER_COMPILE_JOBS is {jobs}; give a positive number")
        return jobs
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def build_library_from_units(sources: Sequence[str | UnitSource], target: Target,
                             opt_level: int = 3,
                             sanitize: bool = False, extra_flags: Sequence[str] = (), *,
                             cache: CompileCache | None = None) -> CachedFile:
    """Compile each C source in ``sources`` to an object (reusing cached ones) and link them
    all into one shared library for ``target``; return the verified library.  A
    :class:`UnitSource` adds its own flags to its unit's compile."""
    if target.arch == "wasm32":
        raise ToolchainError("WebAssembly modules are built from one translation unit; use "
                             "build_library")
    compiler = find_compiler(target)
    flags = compile_flags(compiler, target, opt_level, sanitize, extra_flags)
    object_flags = [flag for flag in flags if flag != "-shared"] + ["-c"]
    identity = [json.dumps(target.to_dict(), sort_keys=True)]
    units = []
    for item in sources:
        unit = item if isinstance(item, UnitSource) else UnitSource(item)
        unit_flags = [*object_flags, *unit.flags]
        units.append(_Unit(cache_key(unit.text, [*unit_flags, *identity], compiler.identity),
                           unit.text, unit.flags))
    cache = cache if cache is not None else CompileCache()
    library_key = cache_key("\0".join(unit.key for unit in units), [*flags, *identity],
                            compiler.identity)
    hit = cache.lookup(library_key, ".so")
    if hit is not None:
        stats.cache_hits += 1
        return hit
    objects = _objects(units, compiler, object_flags, cache)
    temp = _writable(lambda: cache.temp_path(library_key, ".so"), cache)
    try:
        run_compiler(compiler, flags, [obj.path for obj in objects], temp)
        stats.compiles += 1
        return _writable(lambda: cache.commit(temp, library_key, ".so"), cache)
    finally:
        temp.unlink(missing_ok=True)


def _objects(units: list[_Unit], compiler: Compiler, flags: list[str],
             cache: CompileCache) -> list[CachedFile]:
    """The verified object of every unit, compiling the missing ones in parallel."""
    found: dict[str, CachedFile] = {}
    missing: dict[str, _Unit] = {}
    for unit in units:
        if unit.key in found or unit.key in missing:
            continue
        hit = cache.lookup(unit.key, OBJECT_SUFFIX)
        if hit is not None:
            stats.object_hits += 1
            found[unit.key] = hit
        else:
            missing[unit.key] = unit
    if missing:
        jobs = min(compile_jobs(), len(missing))
        # the biggest units first, so that no long compile starts last
        ordered = sorted(missing.values(), key=lambda unit: -len(unit.source))
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="ember-cc") as pool:
            futures = [pool.submit(_compile_object, unit, compiler, flags, cache)
                       for unit in ordered]
            try:
                for unit, future in zip(ordered, futures):
                    found[unit.key] = future.result()
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    return [found[unit.key] for unit in units]


def _compile_object(unit: _Unit, compiler: Compiler, flags: list[str],
                    cache: CompileCache) -> CachedFile:
    src = _writable(lambda: cache.write_text(unit.key, ".c", unit.source), cache)
    temp = _writable(lambda: cache.temp_path(unit.key, OBJECT_SUFFIX), cache)
    try:
        run_compiler(compiler, [*flags, *unit.flags], [src], temp, libraries=())
        stats.objects_compiled += 1
        return _writable(lambda: cache.commit(temp, unit.key, OBJECT_SUFFIX), cache)
    finally:
        temp.unlink(missing_ok=True)


def _writable(action, cache: CompileCache):
    """Run a cache write, turning an OSError into an error that says what to do."""
    try:
        return action()
    except OSError as err:
        raise ToolchainError(f"cannot write to the compile cache {cache.root} ({err}); set "
                             "EMBER_CACHE_DIR to a writable directory") from None

