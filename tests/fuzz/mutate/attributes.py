"""Mutations of node attributes (``attr``): wrong kind, out-of-range or huge values, missing,
unknown, duplicated, and attribute references outside functions.

An op's attribute parsing is written once per op, so every op is a fresh chance to forget a
range or kind check; mutating the attributes of real nodes reaches them all.
"""

from __future__ import annotations

import math
import random

import onnx
from onnx import AttributeProto, helper

from fuzz.hostile import HOSTILE_FLOATS, HOSTILE_INTS, HOSTILE_NAMES
from fuzz.mutate.base import Mutant, NotApplicable, apply_sub_mutations, pick, pick_named, short
from fuzz.mutate.walk import NodeSite, clear_attribute_value, node_sites

KIND_NAMES = {value: name for name, value in AttributeProto.AttributeType.items()}


def _attr_sites(model: onnx.ModelProto, kinds: set[int] | None = None
                ) -> list[tuple[NodeSite, onnx.AttributeProto]]:
    return [(site, attr) for site in node_sites(model) for attr in site.node.attribute
            if kinds is None or attr.type in kinds]


def _numbers(attr: onnx.AttributeProto) -> list[float]:
    """The attribute's numeric content, to carry into another kind (perm [0, 2, 1] becomes
    floats [0.0, 2.0, 1.0], which is the mistake a broken exporter would make)."""
    if attr.type == AttributeProto.INT:
        return [attr.i]
    if attr.type == AttributeProto.FLOAT:
        return [attr.f]
    if attr.type == AttributeProto.INTS:
        return list(attr.ints)
    if attr.type == AttributeProto.FLOATS:
        return list(attr.floats)
    return [1]


def _wrong_kind(model: onnx.ModelProto, rng: random.Random) -> str:
    site, attr = pick(rng, _attr_sites(model), "attribute")
    numbers = _numbers(attr)
    old = KIND_NAMES.get(attr.type, str(attr.type))
    target = pick(rng, [k for k in ("INT", "FLOAT", "INTS", "FLOATS", "STRING", "STRINGS",
                                    "TENSOR", "GRAPH") if k != old])
    clear_attribute_value(attr)
    if target == "INT":
        attr.i = int(numbers[0]) if numbers and math.isfinite(numbers[0]) else 1
    elif target == "FLOAT":
        attr.f = float(numbers[0]) + 0.5 if numbers else 0.5
    elif target == "INTS":
        attr.ints.extend(int(v) for v in numbers if math.isfinite(v))
    elif target == "FLOATS":
        attr.floats.extend(float(v) for v in numbers)
    elif target == "STRING":
        attr.s = str(numbers).encode()
    elif target == "STRINGS":
        attr.strings.extend(str(v).encode() for v in numbers)
    elif target == "TENSOR":
        attr.t.CopyFrom(helper.make_tensor("t", onnx.TensorProto.FLOAT, [len(numbers)],
                                           [float(v) for v in numbers]))
    else:
        attr.g.CopyFrom(helper.make_graph([], "empty", [], []))
    attr.type = getattr(AttributeProto, target)
    return f"{site.label} attribute '{attr.name}' {old} -> {target}"


def _int_out_of_range(model: onnx.ModelProto, rng: random.Random) -> str:
    site, attr = pick(rng, _attr_sites(model, {AttributeProto.INT}), "INT attribute")
    name, value = pick_named(rng, HOSTILE_INTS)
    attr.i = value
    return f"{site.label} attribute '{attr.name}' = {name} ({value})"


def _ints_out_of_range(model: onnx.ModelProto, rng: random.Random) -> str:
    site, attr = pick(rng, _attr_sites(model, {AttributeProto.INTS}), "INTS attribute")
    old = list(attr.ints)
    how = pick(rng, ["element", "append", "drop", "empty", "duplicate", "very-long"])
    if how == "element" and old:
        index = rng.randrange(len(old))
        name, value = pick_named(rng, HOSTILE_INTS)
        attr.ints[index] = value
        detail = f"element {index} = {name} ({value})"
    elif how == "append" or not old:
        name, value = pick_named(rng, HOSTILE_INTS)
        attr.ints.append(value)
        detail = f"appended {name} ({value})"
    elif how == "drop":
        del attr.ints[rng.randrange(len(old))]
        detail = "one element dropped"
    elif how == "empty":
        del attr.ints[:]
        detail = "emptied"
    elif how == "duplicate":
        attr.ints[-1] = attr.ints[0]
        detail = "last element = first element"
    else:
        attr.ints.extend([1] * 100_000)
        detail = "100000 extra elements"
    return f"{site.label} attribute '{attr.name}' {old[:8]} {detail}"


def _int_plausible(model: onnx.ModelProto, rng: random.Random) -> str:
    """A small in-range value instead of a hostile one: the model often stays valid but
    means something else (another axis, stride, transpose), which only a correct compiler
    gets right -- this is the sub-mutation that finds miscompilations."""
    sites = _attr_sites(model, {AttributeProto.INT, AttributeProto.INTS})
    site, attr = pick(rng, sites, "integer attribute")
    if attr.type == AttributeProto.INT:
        old = attr.i
        attr.i = pick(rng, [v for v in (-2, -1, 0, 1, 2, 3) if v != old] or [0])
        return f"{site.label} attribute '{attr.name}' {old} -> {attr.i}"
    if not attr.ints:
        raise NotApplicable("empty INTS")
    index = rng.randrange(len(attr.ints))
    old = list(attr.ints)
    attr.ints[index] = pick(rng, [0, 1, 2, 3, -1])
    return f"{site.label} attribute '{attr.name}' {old} -> {list(attr.ints)}"


def _float_hostile(model: onnx.ModelProto, rng: random.Random) -> str:
    sites = _attr_sites(model, {AttributeProto.FLOAT, AttributeProto.FLOATS})
    site, attr = pick(rng, sites, "FLOAT attribute")
    name, value = pick_named(rng, HOSTILE_FLOATS)
    if attr.type == AttributeProto.FLOAT:
        attr.f = value
    elif attr.floats:
        attr.floats[rng.randrange(len(attr.floats))] = value
    else:
        attr.floats.append(value)
    return f"{site.label} attribute '{attr.name}' gets {name} ({value})"


def _string_hostile(model: onnx.ModelProto, rng: random.Random) -> str:
    site, attr = pick(rng, _attr_sites(model, {AttributeProto.STRING}), "STRING attribute")
    choice = pick(rng, ["bogus", "invalid-utf8", "hostile"])
    if choice == "bogus":
        attr.s = b"FUZZ_NO_SUCH_MODE"
    elif choice == "invalid-utf8":
        attr.s = b"\xff\xfe\x00\xc3"
    else:
        key, text = pick_named(rng, HOSTILE_NAMES)
        attr.s = text.encode("utf-8")
        choice = key
    return f"{site.label} attribute '{attr.name}' = {choice}"


def _delete(model: onnx.ModelProto, rng: random.Random) -> str:
    site, attr = pick(rng, _attr_sites(model), "attribute")
    name = attr.name
    site.node.attribute.remove(attr)
    return f"{site.label} attribute '{name}' deleted"


def _unknown(model: onnx.ModelProto, rng: random.Random) -> str:
    site = pick(rng, node_sites(model), "node")
    site.node.attribute.append(helper.make_attribute("fuzz_unknown", 1))
    return f"{site.label} gains unknown attribute 'fuzz_unknown'"


def _duplicate(model: onnx.ModelProto, rng: random.Random) -> str:
    site, attr = pick(rng, _attr_sites(model, {AttributeProto.INT, AttributeProto.INTS,
                                               AttributeProto.FLOAT}), "numeric attribute")
    twin = onnx.AttributeProto()
    twin.CopyFrom(attr)
    if twin.type == AttributeProto.INT:
        twin.i += 1
    elif twin.type == AttributeProto.FLOAT:
        twin.f += 1.0
    else:
        twin.ints.append(0)
    site.node.attribute.append(twin)
    return f"{site.label} attribute '{attr.name}' given twice (second differs)"


def _ref_outside_function(model: onnx.ModelProto, rng: random.Random) -> str:
    graph_sites = [(s, a) for s, a in _attr_sites(model) if not s.where.startswith("function")]
    site, attr = pick(rng, graph_sites, "graph attribute")
    attr.ref_attr_name = "fuzz_missing"
    return f"{site.label} attribute '{attr.name}' refers to 'fuzz_missing' outside a function"


def _type_says_other(model: onnx.ModelProto, rng: random.Random) -> str:
    site, attr = pick(rng, _attr_sites(model), "attribute")
    old = KIND_NAMES.get(attr.type, str(attr.type))
    new = pick(rng, ["UNDEFINED", "INT", "FLOATS", "GRAPH", "SPARSE_TENSOR", "TYPE_PROTO"])
    attr.type = getattr(AttributeProto, new)
    return f"{site.label} attribute '{attr.name}' holds a {old} value but its type says {new}"


def _missing_required(model: onnx.ModelProto, rng: random.Random) -> str:
    """Remove an attribute ONNX requires (the ``delete`` mutation mostly hits optional ones)."""
    required = {"Cast": "to", "Concat": "axis", "MaxPool": "kernel_shape", "If": "then_branch",
                "Constant": "value", "Gather": "axis", "Transpose": "perm",
                "Flatten": "axis", "Softmax": "axis"}
    sites = [(s, a) for s, a in _attr_sites(model)
             if required.get(s.node.op_type) == a.name]
    site, attr = pick(rng, sites, "required attribute")
    site.node.attribute.remove(attr)
    return f"{site.label} ({site.node.op_type}) lost its '{attr.name}' attribute"


def _attr_name_hostile(model: onnx.ModelProto, rng: random.Random) -> str:
    site, attr = pick(rng, _attr_sites(model), "attribute")
    key, text = pick_named(rng, HOSTILE_NAMES)
    old = attr.name
    attr.name = text
    return f"{site.label} attribute '{old}' renamed to {key} {short(text)}"


def mutate_attributes(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    return apply_sub_mutations(model, rng, {
        "wrong-kind": _wrong_kind, "int-out-of-range": _int_out_of_range,
        "int-plausible": _int_plausible,
        "ints-out-of-range": _ints_out_of_range, "float-hostile": _float_hostile,
        "string-hostile": _string_hostile, "delete": _delete, "unknown": _unknown,
        "duplicate": _duplicate, "ref-outside-function": _ref_outside_function,
        "type-mismatch": _type_says_other, "missing-required": _missing_required,
        "hostile-name": _attr_name_hostile,
    })
