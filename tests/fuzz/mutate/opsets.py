"""Mutations of versions (``opset``): opset imports of 0, 999 or missing, duplicated or
unknown domains, IR versions out of range, node domains nobody imports.

The opset decides which version of an op's semantics applies (and which upgrades the importer
runs); an unexpected version must be refused, not silently treated as another one.
"""

from __future__ import annotations

import random

import onnx

from fuzz.hostile import HOSTILE_NAMES
from fuzz.mutate.base import Mutant, NotApplicable, apply_sub_mutations, pick, short
from fuzz.mutate.walk import node_sites

OPSET_VERSIONS = [0, -1, 1, 5, 6, 7, 11, 12, 13, 18, 21, 22, 23, 24, 25, 999, 2**31, 2**63 - 1]
IR_VERSIONS = [0, -1, 1, 2, 3, 4, 7, 10, 11, 12, 13, 999, 2**63 - 1]


def _default_opset(model: onnx.ModelProto, rng: random.Random) -> str:
    version = pick(rng, OPSET_VERSIONS)
    entries = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not entries:
        raise NotApplicable("no default-domain opset")
    old = entries[0].version
    entries[0].version = version
    return f"default opset {old} -> {version}"


def _no_opset(model: onnx.ModelProto, rng: random.Random) -> str:
    del model.opset_import[:]
    return "opset_import removed entirely"


def _duplicate_opset(model: onnx.ModelProto, rng: random.Random) -> str:
    version = pick(rng, [1, 13, 18, 999])
    model.opset_import.add(domain="", version=version)
    return f"a second default-domain opset_import, version {version}"


def _explicit_ai_onnx(model: onnx.ModelProto, rng: random.Random) -> str:
    for opset in model.opset_import:
        if opset.domain == "":
            opset.domain = "ai.onnx"
    return "default domain spelled 'ai.onnx' (valid)"


def _drop_function_domain(model: onnx.ModelProto, rng: random.Random) -> str:
    domains = {f.domain for f in model.functions}
    if not domains:
        raise NotApplicable("no model-local function")
    kept = [o for o in model.opset_import if o.domain not in domains]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return f"opset_import of the function domain(s) {sorted(domains)} removed"


def _function_opset(model: onnx.ModelProto, rng: random.Random) -> str:
    if not model.functions:
        raise NotApplicable("no model-local function")
    function = pick(rng, list(model.functions))
    if rng.random() < 0.5:
        del function.opset_import[:]
        return f"function '{function.name}' imports no opset"
    version = pick(rng, OPSET_VERSIONS)
    for opset in function.opset_import:
        opset.version = version
    return f"function '{function.name}' opset version -> {version}"


def _ir_version(model: onnx.ModelProto, rng: random.Random) -> str:
    version = pick(rng, IR_VERSIONS)
    old = model.ir_version
    model.ir_version = version
    return f"ir_version {old} -> {version}"


def _node_domain(model: onnx.ModelProto, rng: random.Random) -> str:
    site = pick(rng, [s for s in node_sites(model) if s.node.domain in ("", "ai.onnx")],
                "default-domain node")
    domain = pick(rng, ["ai.onnx", "com.microsoft", "ai.onnx.ml", "fuzz.unknown",
                        "ai.onnx.preview.training", HOSTILE_NAMES["comment-close"]])
    site.node.domain = domain
    return f"{site.label} domain -> {short(domain)}"


def mutate_opsets(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    return apply_sub_mutations(model, rng, {
        "default-opset": _default_opset, "no-opset": _no_opset,
        "duplicate-opset": _duplicate_opset, "explicit-ai-onnx": _explicit_ai_onnx,
        "drop-function-domain": _drop_function_domain, "function-opset": _function_opset,
        "ir-version": _ir_version, "node-domain": _node_domain,
    })
