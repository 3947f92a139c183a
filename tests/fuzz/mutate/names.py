"""Mutations of names (``name``): hostile strings for values, nodes, graphs, functions and
metadata, names that collide once sanitized, invalid UTF-8.

Names are the only free text of a model that reaches generated C, JSON manifests, file names
and error messages.  A consistent rename keeps the model's meaning, so the oracle still
applies: ember must compute the same result whatever the values are called.
"""

from __future__ import annotations

import random

import onnx

from fuzz.hostile import COLLIDING_NAMES, HOSTILE_NAMES
from fuzz.mutate.base import Mutant, NotApplicable, apply_sub_mutations, pick, pick_named, short
from fuzz.mutate.walk import all_value_names, node_sites, rename_value


def _value(model: onnx.ModelProto, rng: random.Random) -> str:
    old = pick(rng, all_value_names(model), "value name")
    key, new = pick_named(rng, HOSTILE_NAMES)
    rename_value(model, old, new)
    return f"value '{old}' renamed to {key} {short(new)}"


def _every_value(model: onnx.ModelProto, rng: random.Random) -> str:
    """Every value gets a distinct hostile name (several injections at once)."""
    key, text = pick_named(rng, HOSTILE_NAMES)
    names = all_value_names(model)
    for i, old in enumerate(names):
        rename_value(model, old, f"{text}{i}")
    return f"all {len(names)} values renamed to {key}+index"


def _collide(model: onnx.ModelProto, rng: random.Random) -> str:
    names = all_value_names(model)
    if len(names) < 2:
        raise NotApplicable("fewer than two values")
    first, second = rng.sample(names, 2)
    new_first, new_second = pick(rng, COLLIDING_NAMES)
    rename_value(model, first, new_first)
    rename_value(model, second, new_second)
    return (f"values '{first}', '{second}' renamed to {new_first!r}, {new_second!r} "
            f"(equal once sanitized)")


def _empty(model: onnx.ModelProto, rng: random.Random) -> str:
    old = pick(rng, all_value_names(model), "value name")
    rename_value(model, old, "")
    return f"value '{old}' renamed to '' (which ONNX reads as 'absent')"


def _node(model: onnx.ModelProto, rng: random.Random) -> str:
    key, text = pick_named(rng, HOSTILE_NAMES)
    sites = node_sites(model)
    if rng.random() < 0.5:
        site = pick(rng, sites, "node")
        label = site.label
        site.node.name = text
        return f"node {label} renamed to {key} {short(text)}"
    for i, site in enumerate(sites):
        site.node.name = text if rng.random() < 0.5 else f"{text}{i}"
    return f"every node renamed to {key} (some identical) {short(text)}"


def _graph(model: onnx.ModelProto, rng: random.Random) -> str:
    key, text = pick_named(rng, HOSTILE_NAMES)
    model.graph.name = text
    return f"graph renamed to {key} {short(text)}"


def _metadata(model: onnx.ModelProto, rng: random.Random) -> str:
    key, text = pick_named(rng, HOSTILE_NAMES)
    model.producer_name = text
    model.producer_version = text
    model.doc_string = text
    model.domain = text
    model.graph.doc_string = text
    for node in model.graph.node:
        node.doc_string = text
    entry = model.metadata_props.add()
    entry.key, entry.value = text, text
    return f"producer, doc strings and metadata set to {key} {short(text)}"


def _function(model: onnx.ModelProto, rng: random.Random) -> str:
    """Rename a model-local function (and its domain) at its definition and call sites."""
    if not model.functions:
        raise NotApplicable("no model-local function")
    function = pick(rng, list(model.functions))
    key, text = pick_named(rng, HOSTILE_NAMES)
    field = pick(rng, ["name", "domain"])
    old = getattr(function, field)
    for site in node_sites(model):
        if (site.node.domain, site.node.op_type) == (function.domain, function.name):
            if field == "name":
                site.node.op_type = text
            else:
                site.node.domain = text
    if field == "domain":
        for opset in model.opset_import:
            if opset.domain == old:
                opset.domain = text
    setattr(function, field, text)
    return f"function {field} '{old}' renamed to {key} {short(text)} (and its uses)"


def _function_values(model: onnx.ModelProto, rng: random.Random) -> str:
    """Rename the formal inputs/outputs and internal values inside a function body."""
    if not model.functions:
        raise NotApplicable("no model-local function")
    function = pick(rng, list(model.functions))
    key, text = pick_named(rng, HOSTILE_NAMES)
    names = list(dict.fromkeys([*function.input, *function.output,
                                *[o for n in function.node for o in n.output]]))
    mapping = {old: f"{text}{i}" for i, old in enumerate(names)}
    for field in (function.input, function.output):
        for i, value in enumerate(field):
            field[i] = mapping.get(value, value)
    for node in function.node:
        for field in (node.input, node.output):
            for i, value in enumerate(field):
                field[i] = mapping.get(value, value)
    return f"function '{function.name}' values renamed to {key}+index"


def _invalid_utf8(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    """Replace a value name, in the serialized bytes, by a same-length invalid UTF-8 string:
    protobuf's API refuses to build such a model, but a file can hold one."""
    data = model.SerializeToString()
    names = [n for n in all_value_names(model) if 1 <= len(n.encode()) < 128]
    old = pick(rng, names, "short value name")
    raw = old.encode()
    pattern = bytes([len(raw)]) + raw
    replacement = bytes([len(raw)]) + b"\xff" + raw[1:]
    if pattern not in data:
        raise NotApplicable("name not found in the serialized model")
    return Mutant(data.replace(pattern, replacement),
                  f"value '{old}' renamed to invalid UTF-8 {replacement[1:]!r}")


def mutate_names(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    return apply_sub_mutations(model, rng, {
        "value": _value, "every-value": _every_value, "collide": _collide, "empty": _empty,
        "node": _node, "graph": _graph, "metadata": _metadata, "function": _function,
        "function-values": _function_values, "invalid-utf8": _invalid_utf8,
    })
