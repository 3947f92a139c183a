"""Targets: host detection, named targets, vector widths and manifest round trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ember.core.dtypes import DType
from ember.core.errors import EmberError
from ember.core.target import Target, TargetError, features_from_cpuinfo


def test_named_targets():
    avx512 = Target.parse("x86_64-avx512")
    assert avx512.vector_bits == 512 and "-march=x86-64-v4" in avx512.march
    assert avx512.lanes_for(DType.FLOAT32) == 16 and avx512.lanes_for(DType.FLOAT64) == 8
    assert avx512.lanes_for(DType.BFLOAT16) == 32 and avx512.lanes_for(DType.INT8) == 64
    avx2 = Target.parse("x86_64-avx2")
    assert avx2.vector_bits == 256 and avx2.has("avx2", "fma") and not avx2.has("avx512f")
    base = Target.parse("x86_64")
    assert base.vector_bits == 128 and base.lanes_for(DType.FLOAT32) == 4
    arm = Target.parse("aarch64")
    assert arm.arch == "aarch64" and arm.has("neon") and arm.lanes_for(DType.FLOAT16) == 8
    wasm = Target.parse("wasm32")
    assert wasm.has("simd128") and wasm.vector_bits == 128 and "-msimd128" in wasm.march


def test_feature_suffixes_add_flags():
    target = Target.parse("x86_64-avx512+avx512_vnni+avx512_bf16+amx")
    assert target.has("avx512_vnni", "avx512_bf16", "amx")
    assert {"-mavx512vnni", "-mavx512bf16", "-mamx-tile"} <= set(target.march)
    arm = Target.parse("aarch64+dotprod+fp16")
    assert arm.march == ("-march=armv8.2-a+dotprod+fp16",)
    with pytest.raises(TargetError, match="unknown x86_64 feature"):
        Target.parse("x86_64+neon")


@pytest.mark.parametrize("name", ["riscv64", "x86_64-avx3", "", "wasm64"])
def test_unknown_targets_are_clear_errors(name):
    with pytest.raises(EmberError, match="unknown target"):
        Target.parse(name)


def test_native_matches_proc_cpuinfo():
    native = Target.parse("native")
    assert native is Target.native() and native.kind == "native"
    assert native.march in (("-march=native",), ("-mcpu=native",))
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo")
    words = set()
    for line in cpuinfo.read_text().splitlines():
        if line.split(":")[0].strip() in ("flags", "Features"):
            words = set(line.split(":", 1)[1].split())
            break
    if native.arch == "x86_64":
        for feature in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"):
            assert (feature in native.features) == (feature in words), feature
        expected_bits = 512 if "avx512f" in words else 256 if "avx" in words else 128
        assert native.vector_bits == expected_bits


def test_cpuinfo_parsing_of_other_machines():
    arm = features_from_cpuinfo("aarch64", {"fp", "asimd", "asimddp", "bf16", "sve"})
    assert arm == {"neon", "dotprod", "bf16", "sve"}
    x86 = features_from_cpuinfo("x86_64", {"avx2", "fma", "amx_tile", "amx_int8", "amx_bf16"})
    assert {"avx2", "fma", "amx", "sse2"} <= x86


@pytest.mark.parametrize("name", ["native", "x86_64-avx512+avx512_vnni", "aarch64", "wasm32"])
def test_manifest_round_trip(name):
    target = Target.parse(name)
    data = json.loads(json.dumps(target.to_dict()))
    assert data["vector_bits"] == target.vector_bits
    # the manifest names the instruction set; the caches and threads (``machine_dict``)
    # are the building machine's, not part of it
    restored = Target.from_dict(data)
    assert restored.to_dict() == target.to_dict()
    assert restored.features == target.features and restored.march == target.march
    with pytest.raises(TargetError):
        Target.from_dict({"kind": "x86_64"})
    with pytest.raises(TargetError):
        Target("sparc", "sparc-sun-solaris")
