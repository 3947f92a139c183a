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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

from ember.core.target import Target
from ember.runtime.cpu import available_cpus
from ember.toolchain.cache import CachedFile, CompileCache, cache_key
from ember.toolchain.compiler import (Compiler, ToolchainError, cache_write, checked_cache,
                                      compile_flags, find_compiler, run_compiler, stats,
                                      with_fallback)

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
    """How many compiler processes run at once: ``$EMBER_COMPILE_JOBS``, else the CPUs this
    process may use (affinity mask and cgroup CPU quota)."""
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
    return available_cpus()


def build_library_from_units(sources: Sequence[str | UnitSource], target: Target,
                             opt_level: int = 3,
                             sanitize: bool = False, extra_flags: Sequence[str] = (), *,
                             cache: CompileCache | None = None) -> CachedFile:
    """Compile each C source in ``sources`` to an object (reusing cached ones) and link them
    all into one shared library for ``target``; return the verified library.  A
    :class:`UnitSource` adds its own flags to its unit's compile."""
    with UnitBuild(target, opt_level, sanitize, extra_flags, cache=cache) as build:
        return build.link(sources)


class UnitBuild:
    """A library built from units whose compiles start as soon as they are submitted.

    A model's kernels are final one after the other; submitting each as it is made lets
    the C compiler work on the first kernels while Python still lowers and schedules the
    rest (on 2 cores that hid most of the Python time of a ResNet-18 build).  :meth:`link`
    takes the full list of units -- submitted or not, the entry unit last made --, waits for
    their objects and links them.  Use it as a context manager: leaving it cancels the
    compiles that have not started and waits for the running ones, so no compiler process
    outlives the build."""

    def __init__(self, target: Target, opt_level: int = 3, sanitize: bool = False,
                 extra_flags: Sequence[str] = (), *, cache: CompileCache | None = None):
        if target.arch == "wasm32":
            raise ToolchainError("WebAssembly modules are built from one translation unit; "
                                 "use build_library")
        self.compiler = find_compiler(target)
        self.flags = compile_flags(self.compiler, target, opt_level, sanitize, extra_flags)
        self.object_flags = [flag for flag in self.flags if flag != "-shared"] + ["-c"]
        self.identity = [json.dumps(target.to_dict(), sort_keys=True)]
        self.cache = checked_cache(cache if cache is not None else CompileCache())
        self._objects: dict[str, CachedFile | Future] = {}
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> "UnitBuild":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def submit(self, item: str | UnitSource) -> None:
        """Start compiling a unit (unless its object is cached or already on its way)."""
        self._start(self._unit(item))

    def link(self, sources: Sequence[str | UnitSource],
             on_progress: Callable[[int, int], None] | None = None) -> CachedFile:
        """The verified library of exactly these units (a unit given twice is linked once:
        its symbols would collide).  ``on_progress(done, total)`` hears of each object
        ready."""
        units = list({unit.key: unit for unit in map(self._unit, sources)}.values())
        library_key = cache_key("\0".join(unit.key for unit in units),
                                [*self.flags, *self.identity], self.compiler.identity)
        hit = self.cache.lookup(library_key, ".so")
        if hit is not None:
            stats.cache_hits += 1
            return hit
        for unit in sorted(units, key=lambda u: -len(u.source)):  # no long compile last
            self._start(unit)
        objects = []
        for unit in units:
            objects.append(self._object(unit.key))
            if on_progress is not None:
                on_progress(len(objects), len(units))

        def link_in(into: CompileCache) -> CachedFile:
            temp = cache_write(into, lambda: into.temp_path(library_key, ".so"))
            try:
                cache_write(into, lambda: run_compiler(self.compiler, self.flags,
                                                       [obj.path for obj in objects], temp))
                stats.compiles += 1
                return cache_write(into, lambda: into.commit(temp, library_key, ".so"))
            finally:
                temp.unlink(missing_ok=True)

        return with_fallback(self.cache, link_in)

    def objects(self, sources: Sequence[str | UnitSource]) -> list[CachedFile]:
        """The verified object files of exactly these units (compiled or taken from the
        cache), in order, each unit once: what a static library archives."""
        units = list({unit.key: unit for unit in map(self._unit, sources)}.values())
        for unit in units:
            self._start(unit)
        return [self._object(unit.key) for unit in units]

    def _unit(self, item: str | UnitSource) -> _Unit:
        unit = item if isinstance(item, UnitSource) else UnitSource(item)
        key = cache_key(unit.text, [*self.object_flags, *unit.flags, *self.identity],
                        self.compiler.identity)
        return _Unit(key, unit.text, unit.flags)

    def _start(self, unit: _Unit) -> None:
        if unit.key in self._objects:
            return
        hit = self.cache.lookup(unit.key, OBJECT_SUFFIX)
        if hit is not None:
            stats.object_hits += 1
            self._objects[unit.key] = hit
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=compile_jobs(),
                                            thread_name_prefix="ember-cc")
        self._objects[unit.key] = self._pool.submit(_compile_object, unit, self.compiler,
                                                    self.object_flags, self.cache)

    def _object(self, key: str) -> CachedFile:
        value = self._objects[key]
        if isinstance(value, Future):
            value = value.result()
            self._objects[key] = value
        return value


def _compile_object(unit: _Unit, compiler: Compiler, flags: list[str],
                    cache: CompileCache) -> CachedFile:
    """Compile ``unit`` into an object in ``cache`` (in the process's temporary cache when
    ``cache`` cannot be written: ``with_fallback``)."""

    def compile_in(into: CompileCache) -> CachedFile:
        src = cache_write(into, lambda: into.write_text(unit.key, ".c", unit.source))
        temp = cache_write(into, lambda: into.temp_path(unit.key, OBJECT_SUFFIX))
        try:
            cache_write(into, lambda: run_compiler(compiler, [*flags, *unit.flags], [src],
                                                   temp, libraries=()))
            stats.objects_compiled += 1
            return cache_write(into, lambda: into.commit(temp, unit.key, OBJECT_SUFFIX))
        finally:
            temp.unlink(missing_ok=True)

    return with_fallback(cache, compile_in)
