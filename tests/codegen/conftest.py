"""Fixtures of the codegen tests: a private compile cache and the library of all cases."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from codegen_cases import runnable_cases  # noqa: E402

from ember.codegen import CModule, generate_c  # noqa: E402
from ember.core.target import Target  # noqa: E402
from ember.toolchain import CompileCache, compile_shared  # noqa: E402

STRICT = ("-Wall", "-Wextra", "-Werror")  # the generated C must compile without warnings


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ember-cache")


@pytest.fixture(scope="session")
def cache(cache_dir) -> CompileCache:
    return CompileCache(cache_dir)


@pytest.fixture(scope="session")
def cases_module_source() -> str:
    kernels = [c.func for c in runnable_cases()]
    return generate_c(CModule(kernels, Target.native(), exports=[k.name for k in kernels]))


@pytest.fixture(scope="session")
def cases_lib(cases_module_source, cache) -> ctypes.CDLL:
    return ctypes.CDLL(str(compile_shared(cases_module_source, Target.native(),
                                          extra_flags=STRICT, cache=cache)))
