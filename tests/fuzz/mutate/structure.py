"""Mutations of nested structure (``structure``): If branches that disagree, conditions of
the wrong type, deep nesting, and model-local functions that recurse, are missing, or are
called with the wrong arity or without their attributes.

Subgraphs and functions are expanded recursively by the importer; recursion without a bound
or a check is the classic way to turn a small hostile file into a hang or a stack overflow.
"""

from __future__ import annotations

import random

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from fuzz.mutate.base import Mutant, NotApplicable, apply_sub_mutations, pick
from fuzz.mutate.walk import node_sites


def _if_node(model: onnx.ModelProto) -> onnx.NodeProto:
    for node in model.graph.node:
        if node.op_type == "If":
            return node
    raise NotApplicable("no If node")


def _branch(node: onnx.NodeProto, name: str) -> onnx.GraphProto:
    for attr in node.attribute:
        if attr.name == name:
            return attr.g
    raise NotApplicable(f"If has no {name}")


def _branch_output_count(model: onnx.ModelProto, rng: random.Random) -> str:
    branch = _branch(_if_node(model), pick(rng, ["then_branch", "else_branch"]))
    branch.output.append(branch.output[0])
    return f"{branch.name} returns two outputs, the If declares one"


def _branch_output_shape(model: onnx.ModelProto, rng: random.Random) -> str:
    branch = _branch(_if_node(model), pick(rng, ["then_branch", "else_branch"]))
    produced = branch.output[0].name
    branch.node.append(helper.make_node("ReduceSum", [produced], ["fuzz_reduced"],
                                        name="fuzz_reduce", keepdims=0))
    branch.output[0].CopyFrom(helper.make_tensor_value_info("fuzz_reduced", TensorProto.FLOAT,
                                                            []))
    return f"{branch.name} returns a scalar, the other branch a [2, 3] tensor"


def _branch_output_dtype(model: onnx.ModelProto, rng: random.Random) -> str:
    branch = _branch(_if_node(model), pick(rng, ["then_branch", "else_branch"]))
    produced = branch.output[0].name
    branch.node.append(helper.make_node("Cast", [produced], ["fuzz_cast"], name="fuzz_cast",
                                        to=TensorProto.INT64))
    branch.output[0].CopyFrom(helper.make_tensor_value_info("fuzz_cast", TensorProto.INT64,
                                                            [2, 3]))
    return f"{branch.name} returns int64, the other branch float"


def _condition(model: onnx.ModelProto, rng: random.Random) -> str:
    node = _if_node(model)
    choice = pick(rng, ["float tensor", "bool vector", "missing", "empty name"])
    if choice == "float tensor":
        node.input[0] = model.graph.input[0].name
    elif choice == "bool vector":
        model.graph.initializer.append(numpy_helper.from_array(np.array([True, False]),
                                                               "fuzz_cond"))
        node.input[0] = "fuzz_cond"
    elif choice == "missing":
        del node.input[:]
    else:
        node.input[0] = ""
    return f"If condition is a {choice}"


def _missing_branch(model: onnx.ModelProto, rng: random.Random) -> str:
    node = _if_node(model)
    name = pick(rng, ["then_branch", "else_branch"])
    for attr in list(node.attribute):
        if attr.name == name:
            node.attribute.remove(attr)
    return f"If without {name}"


def _branch_with_input(model: onnx.ModelProto, rng: random.Random) -> str:
    branch = _branch(_if_node(model), pick(rng, ["then_branch", "else_branch"]))
    branch.input.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]))
    return f"{branch.name} declares an input 'x' (If branches take none; shadows outer x)"


def _deep_nesting(model: onnx.ModelProto, rng: random.Random) -> str:
    """Wrap the then-branch in ``depth`` nested Ifs on the same condition."""
    node = _if_node(model)
    depth = pick(rng, [8, 24])  # protobuf refuses ~30 levels
    then_attr = next(a for a in node.attribute if a.name == "then_branch")
    inner = onnx.GraphProto()
    inner.CopyFrom(then_attr.g)
    other = _branch(node, "else_branch")
    for level in range(depth):
        out = f"fuzz_nested_{level}"
        wrapper = helper.make_graph(
            [helper.make_node("If", ["cond"], [out], name=f"fuzz_if_{level}",
                              then_branch=inner, else_branch=other)],
            f"nest_{level}", [], [helper.make_tensor_value_info(out, TensorProto.FLOAT,
                                                                [2, 3])])
        inner = wrapper
    then_attr.g.CopyFrom(inner)
    return f"then_branch wrapped in {depth} nested Ifs"


def _call_sites(model: onnx.ModelProto) -> list:
    local = {(f.domain, f.name) for f in model.functions}
    sites = [s for s in node_sites(model) if (s.node.domain, s.node.op_type) in local]
    if not sites:
        raise NotApplicable("no call of a model-local function")
    return sites


def _forwarded_attributes(function: onnx.FunctionProto) -> list[onnx.AttributeProto]:
    """References passing the function's own attributes on to a call in its body, so that a
    recursive call is well-formed apart from the recursion itself."""
    return [helper.make_attribute_ref(name, AttributeProto.FLOAT, ref_attr_name=name)
            for name in function.attribute]


def _recursive_function(model: onnx.ModelProto, rng: random.Random) -> str:
    _call_sites(model)
    function = model.functions[0]
    output = function.output[0]
    function.node[-1].output[0] = "fuzz_before_recursion"
    call = helper.make_node(function.name, ["fuzz_before_recursion"], [output],
                            name="recurse", domain=function.domain)
    call.attribute.extend(_forwarded_attributes(function))
    function.node.append(call)
    return f"function '{function.name}' calls itself (forwarding its attributes)"


def _mutual_recursion(model: onnx.ModelProto, rng: random.Random) -> str:
    _call_sites(model)
    first = model.functions[0]
    second = onnx.FunctionProto()
    second.CopyFrom(first)
    second.name = "FuzzOther"
    for function, callee in ((first, second), (second, first)):
        function.node[-1].output[0] = "fuzz_mid"
        call = helper.make_node(callee.name, ["fuzz_mid"], [function.output[0]],
                                name="call_other", domain=callee.domain)
        call.attribute.extend(_forwarded_attributes(function))
        function.node.append(call)
    model.functions.append(second)
    return f"functions '{first.name}' and 'FuzzOther' call each other"


def _missing_function(model: onnx.ModelProto, rng: random.Random) -> str:
    site = pick(rng, _call_sites(model))
    site.node.op_type = "FuzzNoSuchFunction"
    return f"{site.label} calls 'FuzzNoSuchFunction' in a local domain that does not define it"


def _call_arity(model: onnx.ModelProto, rng: random.Random) -> str:
    site = pick(rng, _call_sites(model))
    if rng.random() < 0.5:
        site.node.input.append(site.node.input[0])
        return f"{site.label} passes two inputs to a one-input function"
    del site.node.input[:]
    return f"{site.label} passes no input to a one-input function"


def _unproduced_function_output(model: onnx.ModelProto, rng: random.Random) -> str:
    _call_sites(model)
    function = model.functions[0]
    function.output[0] = "fuzz_never_produced"
    return f"function '{function.name}' output is never produced by its body"


def _missing_attribute(model: onnx.ModelProto, rng: random.Random) -> str:
    site = pick(rng, [s for s in _call_sites(model) if s.node.attribute],
                "call with attributes")
    del site.node.attribute[:]
    return f"{site.label} omits the attribute the function body refers to"


def _wrong_attribute_kind(model: onnx.ModelProto, rng: random.Random) -> str:
    site = pick(rng, [s for s in _call_sites(model) if s.node.attribute],
                "call with attributes")
    attr = site.node.attribute[0]
    attr.ClearField("f")
    attr.type = AttributeProto.STRING
    attr.s = b"not a number"
    return f"{site.label} passes attribute '{attr.name}' as a string"


def _duplicate_function(model: onnx.ModelProto, rng: random.Random) -> str:
    _call_sites(model)
    twin = onnx.FunctionProto()
    twin.CopyFrom(model.functions[0])
    twin.node[-1].op_type = "Sigmoid"
    model.functions.append(twin)
    return f"function '{twin.name}' defined twice (second body differs)"


def _empty_function(model: onnx.ModelProto, rng: random.Random) -> str:
    _call_sites(model)
    del model.functions[0].node[:]
    return f"function '{model.functions[0].name}' has an empty body"


def mutate_structure(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    return apply_sub_mutations(model, rng, {
        "branch-output-count": _branch_output_count,
        "branch-output-shape": _branch_output_shape,
        "branch-output-dtype": _branch_output_dtype, "if-condition": _condition,
        "missing-branch": _missing_branch, "branch-with-input": _branch_with_input,
        "deep-nesting": _deep_nesting, "recursive-function": _recursive_function,
        "mutual-recursion": _mutual_recursion, "missing-function": _missing_function,
        "call-arity": _call_arity, "unproduced-function-output": _unproduced_function_output,
        "missing-attribute": _missing_attribute,
        "wrong-attribute-kind": _wrong_attribute_kind,
        "duplicate-function": _duplicate_function, "empty-function": _empty_function,
    })
