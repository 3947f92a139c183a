"""The library's description of itself, and its cross-check with the manifest.

Every library ember generates exports ``const char *ember_signature(void)``: a JSON text of
numbers and element type names only::

    {"abi": 1, "inputs": [{"dtype": "float32", "shape": [1, 3]}], "outputs": [...],
     "workspace_size": N, "weights_size": M,
     "weights": [{"offset": 0, "dtype": "float32", "shape": [3]}, ...],   (offset order)
     "host_nodes": [{"index": i, "inputs": [...], "outputs": [...]}],
     "steps": S, "input_alignment": A}

``steps`` -- the number of steps, i.e. the length of the ``step_seconds`` array that
``ember_run_profiled`` writes -- came later within ABI 1: a library without it (or without
``ember_run_profiled``) runs as before but cannot be profiled.  So did ``input_alignment``,
the bytes of alignment the code assumes of an input pointer (beyond its element type's): a
library without it assumes :data:`LEGACY_INPUT_ALIGNMENT`, and the runtime copies an input
that is not aligned so.

The runtime sizes every buffer it hands to ``ember_run`` (inputs, outputs, weights, workspace,
the views a host callback gets) from the manifest.  A manifest that says more or less than the
code reads and writes would make the code run past a buffer; comparing the two before the
first run turns an edited manifest, or a library taken from another artifact, into a
:class:`ModelLoadError` instead of memory corruption.

``ember_run`` returns 0, or ``node_index * 256 + code`` with the codes below.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.runtime.errors import ModelLoadError
from ember.runtime.manifest import (MAX_BYTES, Manifest, SchemaError, TensorSpec, strict_json,
                                    tensor_spec)

ABI_VERSION = 1
STATUS_HOST_FAILED = 1
STATUS_INDEX_OUT_OF_RANGE = 2
STATUS_EXCLUDED_VALUE = 3  # an input holds a value an ``outside`` check excludes (divisor 0)
MAX_SIGNATURE_BYTES = 64 << 20
# More steps than this is no model ember builds: a bound on the timing array the runtime
# allocates from the library's word.
MAX_STEPS = 1 << 24
# What libraries from before ``input_alignment`` assume of every input pointer.
LEGACY_INPUT_ALIGNMENT = 64
MAX_INPUT_ALIGNMENT = 4096


@dataclass(frozen=True)
class HostNodeSignature:
    index: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class Signature:
    """What ``ember_signature()`` returned, parsed (tensor specs have no names)."""

    abi: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    workspace_size: int
    weights_size: int
    weights: tuple[tuple[int, TensorSpec], ...]  # (offset, spec) of every constant read
    host_nodes: tuple[HostNodeSignature, ...]
    steps: int | None = None  # None: a library from before ember_run_profiled
    input_alignment: int = LEGACY_INPUT_ALIGNMENT


def parse_signature(text: bytes, source: str) -> Signature:
    """Validate the signature JSON of the library ``source`` (same rules as the manifest)."""
    data = strict_json(text, f"the signature of {source}")
    try:
        return _parse(data)
    except SchemaError as error:
        raise ModelLoadError(f"the signature of {source} is malformed: field '{error.field}' "
                             f"{error.problem}; rebuild the artifact with this ember") from None


def _parse(data: object) -> Signature:
    if not isinstance(data, dict):
        raise SchemaError("(top level)", "must be a JSON object")
    for key in ("abi", "inputs", "outputs", "workspace_size", "weights_size", "weights",
                "host_nodes"):
        if key not in data:
            raise SchemaError(key, "is missing")
    abi = data["abi"]
    if not isinstance(abi, int) or isinstance(abi, bool) or abi != ABI_VERSION:
        raise SchemaError("abi", f"is {abi!r}; this runtime calls libraries of ABI version "
                                 f"{ABI_VERSION}")
    host_nodes = []
    for i, item in enumerate(_list(data["host_nodes"], "host_nodes")):
        if not isinstance(item, dict) or set(item) != {"index", "inputs", "outputs"}:
            raise SchemaError(f"host_nodes[{i}]", "must be an object of index, inputs, outputs")
        host_nodes.append(HostNodeSignature(_size(item["index"], f"host_nodes[{i}].index"),
                                            _specs(item["inputs"], f"host_nodes[{i}].inputs"),
                                            _specs(item["outputs"], f"host_nodes[{i}].outputs")))
    weights = []
    for i, item in enumerate(_list(data["weights"], "weights")):
        if not isinstance(item, dict) or "offset" not in item:
            raise SchemaError(f"weights[{i}]", "must be an object of offset, dtype, shape")
        spec = {key: value for key, value in item.items() if key != "offset"}
        weights.append((_size(item["offset"], f"weights[{i}].offset"),
                        tensor_spec(spec, f"weights[{i}]", named=False)))
    steps = None
    if "steps" in data:
        steps = data["steps"]
        if not isinstance(steps, int) or isinstance(steps, bool) or not 0 <= steps <= MAX_STEPS:
            raise SchemaError("steps", f"must be an integer in [0, {MAX_STEPS}]")
        if any(node.index >= steps for node in host_nodes):
            raise SchemaError("steps", "must exceed the index of every host node")
    input_alignment = LEGACY_INPUT_ALIGNMENT
    if "input_alignment" in data:
        input_alignment = data["input_alignment"]
        if not isinstance(input_alignment, int) or isinstance(input_alignment, bool) or \
                not 1 <= input_alignment <= MAX_INPUT_ALIGNMENT or \
                input_alignment & (input_alignment - 1):
            raise SchemaError("input_alignment", f"must be a power of two in [1, "
                                                 f"{MAX_INPUT_ALIGNMENT}]")
    return Signature(abi, _specs(data["inputs"], "inputs"), _specs(data["outputs"], "outputs"),
                     _size(data["workspace_size"], "workspace_size"),
                     _size(data["weights_size"], "weights_size"), tuple(weights),
                     tuple(host_nodes), steps, input_alignment)


def _list(value: object, where: str) -> list:
    if not isinstance(value, list):
        raise SchemaError(where, "must be a JSON list")
    return value


def _specs(value: object, where: str) -> tuple[TensorSpec, ...]:
    return tuple(tensor_spec(item, f"{where}[{i}]", named=False)
                 for i, item in enumerate(_list(value, where)))


def _size(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_BYTES:
        raise SchemaError(where, f"must be an integer in [0, {MAX_BYTES}]")
    return value


def check_manifest(manifest: Manifest, signature: Signature, workspace_size: int,
                   source: str) -> None:
    """Refuse a manifest that describes other buffers than the library ``source`` uses.

    ``workspace_size`` is what the library's ``ember_workspace_size()`` returned.
    """
    problems: list[str] = []
    _compare_specs("inputs", manifest.inputs, signature.inputs, problems)
    _compare_specs("outputs", manifest.outputs, signature.outputs, problems)
    for field, said, actual in (("workspace_size", manifest.workspace_size,
                                 signature.workspace_size),
                                ("workspace_size", manifest.workspace_size, workspace_size),
                                ("weights_size", manifest.weights_size,
                                 signature.weights_size)):
        if said != actual:
            problems.append(f"{field} is {said} in the manifest, {actual} in the library")
    said_weights = sorted((entry.offset, entry.dtype, entry.shape) for entry in manifest.weights)
    actual_weights = [(offset, spec.dtype, spec.shape) for offset, spec in signature.weights]
    if said_weights != actual_weights:
        moved = [f"{said[1]}{list(said[2])} at offset {said[0]}"
                 for said in said_weights if said not in actual_weights]
        problems.append(f"weights differ: the manifest places {len(said_weights)} constant(s), "
                        f"the library reads {len(actual_weights)}"
                        + (f" (not read by the library: {', '.join(moved[:3])})" if moved else ""))
    said_nodes = [entry.index for entry in manifest.host_nodes]
    actual_nodes = [node.index for node in signature.host_nodes]
    if said_nodes != actual_nodes:
        problems.append(f"host_nodes are nodes {said_nodes} in the manifest, {actual_nodes} in "
                        f"the library")
    else:
        for i, (entry, node) in enumerate(zip(manifest.host_nodes, signature.host_nodes)):
            _compare_specs(f"host_nodes[{i}].inputs", entry.inputs, node.inputs, problems)
            _compare_specs(f"host_nodes[{i}].outputs", entry.outputs, node.outputs, problems)
    if problems:
        shown = "; ".join(problems[:6]) + ("; ..." if len(problems) > 6 else "")
        raise ModelLoadError(f"manifest.json does not describe the library {source}: {shown}. "
                             f"The manifest was edited or the library comes from another "
                             f"artifact; compile and save the model again")


def _compare_specs(field: str, said: tuple[TensorSpec, ...], actual: tuple[TensorSpec, ...],
                   problems: list[str]) -> None:
    if len(said) != len(actual):
        problems.append(f"{field} has {len(said)} entries in the manifest, {len(actual)} in "
                        f"the library")
        return
    for i, (mine, theirs) in enumerate(zip(said, actual)):
        if (mine.dtype, mine.shape) != (theirs.dtype, theirs.shape):
            problems.append(f"{field}[{i}] ({mine.name!r}) is {mine.describe()} in the "
                            f"manifest, {theirs.describe()} in the library")
