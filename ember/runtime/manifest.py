"""The artifact manifest: its strict schema, its digest, and the frozen object it parses into.

Every field the runtime uses is checked here, before anything else of the artifact is read:
types (an ``int`` is never a ``bool`` or a float), ranges (sizes non-negative and bounded,
shapes lists of non-negative ints, weights inside the weights blob and not overlapping),
required keys (and no unknown ones), element type names from a closed list, host-node and
index-check entries.  A failure is a :class:`ModelLoadError` naming the file and the field.

The manifest carries ``manifest_sha256``: the SHA-256 of its canonical JSON form (sorted keys,
no whitespace, ASCII) without that field.  It covers the digests of the other files, so the
one value identifies the whole artifact.  It detects corruption and partial edits; it is not
a signature (whoever edits the manifest can recompute it), which is why the loader also
cross-checks the manifest with what the library says about itself (``ember_signature``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any, Mapping

from ember.runtime.dtypes import ITEMSIZE
from ember.runtime.errors import ModelLoadError

FORMAT = "ember-artifact"
FORMAT_VERSION = 2

MANIFEST_FILE = "manifest.json"
LIBRARY_FILE = "model.so"
WEIGHTS_FILE = "weights.safetensors"
HOST_NODES_FILE = "host_nodes.json"
DIGEST_FIELD = "manifest_sha256"
SCHEDULES = "schedules"  # optional: written only when a kernel has a non-default config

# Bounds: far above any real model, low enough that a forged number cannot make the loader
# allocate absurd amounts before the library's own signature has confirmed it.
MAX_BYTES = 1 << 40          # one buffer, the workspace or the weights blob
MAX_RANK = 32
MAX_DIM = 1 << 40

_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_REMEDY = "the artifact is malformed or was edited; save it again with this ember"

_TOP_LEVEL = {"format", "format_version", "ember_version", "model", "target", "inputs",
              "outputs", "workspace_size", "weights_size", "weights", "host_nodes", "checks",
              "files", DIGEST_FIELD}


@dataclass(frozen=True)
class ScheduleEntry:
    """A kernel built with a config other than the default heuristic's: which step, its
    workload key, where the config came from ("tuned": a tuning database, "given": the
    caller's ``kernel_configs``) and the config's knob values."""

    step: int
    workload_key: str
    source: str
    config: Mapping[str, Any]


@dataclass(frozen=True)
class TensorSpec:
    """A buffer the library reads or writes: element type name and static shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def nbytes(self) -> int:
        return self.size * ITEMSIZE[self.dtype]

    def describe(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


@dataclass(frozen=True)
class WeightEntry:
    """A constant: tensor ``key`` of the weights file, copied to ``offset`` of the blob."""

    name: str
    key: str
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class HostNodeEntry:
    """A node that runs its numpy reference through the host callback.  Its buffers are its
    explicit inputs, then the values its subgraphs read from outside (``implicit_inputs``),
    then its outputs; ``detail`` is its entry of host_nodes.json (filled in by the loader)."""

    index: int
    op: str
    name: str
    reason: str
    inputs: tuple[TensorSpec, ...]
    implicit_inputs: tuple[str, ...]
    outputs: tuple[TensorSpec, ...]
    detail: Any = None


@dataclass(frozen=True)
class IndexCheck:
    """Every value of input ``input`` of node ``node_index`` must lie in ``[low, high)``; the
    library returns status ``node_index * 256 + 2`` when one does not.  A ``stride`` above
    1 checks only every ``stride``-th value from ``start``: one component of the index tuples
    (each component of GatherND's tuples addresses a dim of its own size).  An ``outside``
    check asks the opposite, that no value lie in ``[low, high)`` -- an integer divisor must
    not be 0 -- and fails with status ``node_index * 256 + 3``."""

    node_index: int
    node: str
    op: str
    input: str
    low: int
    high: int
    start: int = 0
    stride: int = 1
    outside: bool = False

    def to_json(self) -> dict[str, Any]:
        """The manifest's record; ``start`` and ``stride`` only for a strided check and
        ``outside`` only when set, so that other checks read as before and a runtime that
        cannot stride or exclude refuses the artifact."""
        record = asdict(self)
        if self.stride == 1:
            del record["start"], record["stride"]
        if not self.outside:
            del record["outside"]
        return record

    def describe(self) -> str:
        """What the check asks of the input, for an error message."""
        values = f"input '{self.input}'" if self.stride == 1 else \
            f"component {self.start} of each {self.stride}-tuple of input '{self.input}'"
        if self.outside:
            if self.high == self.low + 1:
                return f"{values} must not hold {self.low}"
            return f"{values} must lie outside [{self.low}, {self.high})"
        return f"{values} must lie in [{self.low}, {self.high})"

    @property
    def is_zero_divisor_check(self) -> bool:
        """Whether this is the check of an integer divisor (no value may be 0)."""
        return self.outside and (self.low, self.high) == (0, 1)


@dataclass(frozen=True)
class Manifest:
    """A validated manifest.json (format version 2)."""

    ember_version: str
    model: str
    arch: str
    required_features: tuple[str, ...]
    target: Mapping[str, Any]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    workspace_size: int
    weights_size: int
    weights: tuple[WeightEntry, ...]
    host_nodes: tuple[HostNodeEntry, ...]
    checks: tuple[IndexCheck, ...]
    files: Mapping[str, str]
    digest: str
    # Kernels not scheduled by the default heuristic: informational, the runtime uses none
    schedules: tuple["ScheduleEntry", ...] = ()

    def required_files(self) -> tuple[str, ...]:
        """The files the artifact must hold besides the manifest (fixed names)."""
        return (LIBRARY_FILE, WEIGHTS_FILE) + ((HOST_NODES_FILE,) if self.host_nodes else ())


# ---------------------------------------------------------------------- JSON and digest


def strict_json(data: bytes, source: str) -> Any:
    """Parse UTF-8 JSON, refusing what ``json.loads`` would let through: invalid UTF-8,
    duplicate keys (the digest and the reader could see different values), NaN/Infinity and
    nesting deep enough to exhaust the stack."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ModelLoadError(f"{source} is not valid UTF-8 (byte {error.start}); {_REMEDY}") \
            from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys,
                          parse_constant=_no_constants, parse_float=_finite_float)
    except _DuplicateKey as error:
        raise ModelLoadError(f"{source} has the key '{error.args[0]}' twice; {_REMEDY}") \
            from None
    except (ValueError, RecursionError) as error:
        raise ModelLoadError(f"{source} is not valid JSON ({error}); {_REMEDY}") from None


class _DuplicateKey(Exception):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    """A JSON number that fits a float (``1e999`` would parse to infinity)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def canonical_digest(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``manifest`` without its digest field."""
    body = {key: value for key, value in manifest.items() if key != DIGEST_FIELD}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def seal(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """``manifest`` with its digest field set (what the artifact writer stores)."""
    return {**{k: v for k, v in manifest.items() if k != DIGEST_FIELD},
            DIGEST_FIELD: canonical_digest(manifest)}


def check_header(data: Any, source: str, expected_format: str = FORMAT,
                 expected_version: int = FORMAT_VERSION,
                 kind: str = "an ember artifact manifest", format_name: str = "artifact") -> None:
    """The checks that come before the digest: an object of this format and version (the
    manifest's by default; ``kind`` and ``format_name`` name another file's in messages)."""
    if not isinstance(data, dict):
        raise ModelLoadError(f"{source} must hold a JSON object, found a JSON "
                             f"{_json_kind(data)}; not {kind}")
    if data.get("format") != expected_format:
        raise ModelLoadError(f"{source} is not {kind} (field 'format' is "
                             f"{data.get('format')!r}, expected {expected_format!r})")
    version = data.get("format_version")
    if version != expected_version or isinstance(version, bool):
        raise ModelLoadError(f"{source}: {format_name} format version {version!r} is not "
                             f"supported by this runtime (it reads version "
                             f"{expected_version}); compile and save the model again with "
                             f"this ember")


def verify_digest(data: Mapping[str, Any], source: str) -> str:
    """Check ``manifest_sha256`` against the manifest's content; return it."""
    stored = data.get(DIGEST_FIELD)
    if not isinstance(stored, str) or not _HEX64.match(stored):
        raise ModelLoadError(f"{source}: field '{DIGEST_FIELD}' is missing or not a SHA-256 "
                             f"hex digest; {_REMEDY}")
    actual = canonical_digest(data)
    if actual != stored:
        raise ModelLoadError(f"{source} was modified or is corrupted: its content has SHA-256 "
                             f"{actual[:12]}…, field '{DIGEST_FIELD}' says {stored[:12]}…; "
                             f"{_REMEDY}")
    return stored


# ---------------------------------------------------------------------- schema


class SchemaError(Exception):
    """A field that breaks the schema: ``field`` (a path like ``inputs[0].shape``), why."""

    def __init__(self, field: str, problem: str):
        super().__init__(field, problem)
        self.field = field
        self.problem = problem


def parse_manifest(data: Any, source: str) -> Manifest:
    """Validate a manifest (already digest-checked) and return it as a :class:`Manifest`."""
    check_header(data, source)
    try:
        return _parse(data)
    except SchemaError as error:
        raise ModelLoadError(f"{source}: field '{error.field}' {error.problem}; {_REMEDY}") \
            from None


def _parse(data: dict[str, Any]) -> Manifest:
    _keys(data, "", required=_TOP_LEVEL - {DIGEST_FIELD}, optional={DIGEST_FIELD, SCHEDULES})
    target = _object(data["target"], "target")
    _keys(target, "target", required={"arch", "required_features"}, optional=None)
    inputs = _tensor_list(data["inputs"], "inputs", named=True)
    seen: set[str] = set()
    for i, spec in enumerate(inputs):  # inputs are bound by name: one name, one input
        if spec.name in seen:
            raise SchemaError(f"inputs[{i}].name", f"repeats the input name {spec.name!r}")
        seen.add(spec.name)
    weights_size = _int(data["weights_size"], "weights_size", 0, MAX_BYTES)
    host_nodes = _host_nodes(data["host_nodes"])
    files = _object(data["files"], "files")
    expected_files = {LIBRARY_FILE, WEIGHTS_FILE} | ({HOST_NODES_FILE} if host_nodes else set())
    _keys(files, "files", required=expected_files, optional=set())
    for name, digest in files.items():
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise SchemaError(f"files.{name}", "must be a lowercase SHA-256 hex digest")
    return Manifest(
        ember_version=_str(data["ember_version"], "ember_version"),
        model=_str(data["model"], "model"),
        arch=_str(target["arch"], "target.arch"),
        required_features=tuple(_str(f, f"target.required_features[{i}]") for i, f in
                                enumerate(_list(target["required_features"],
                                                "target.required_features"))),
        target=MappingProxyType(dict(target)),
        inputs=inputs,
        outputs=_tensor_list(data["outputs"], "outputs", named=True),
        workspace_size=_int(data["workspace_size"], "workspace_size", 0, MAX_BYTES),
        weights_size=weights_size,
        weights=_weights(data["weights"], weights_size),
        host_nodes=host_nodes,
        checks=_checks(data["checks"]),
        files=MappingProxyType(dict(files)),
        digest=str(data.get(DIGEST_FIELD, "")),
        schedules=_schedules(data.get(SCHEDULES, [])),
    )


def _schedules(value: Any) -> tuple[ScheduleEntry, ...]:
    entries = []
    for i, raw in enumerate(_list(value, SCHEDULES)):
        where = f"{SCHEDULES}[{i}]"
        item = _object(raw, where)
        _keys(item, where, required={"step", "workload_key", "source", "config"},
              optional=set())
        config = _object(item["config"], f"{where}.config")
        for name, knob in config.items():
            if not (knob is None or isinstance(knob, bool | int | str) or
                    isinstance(knob, list) and all(isinstance(v, int) and
                                                   not isinstance(v, bool) for v in knob)):
                raise SchemaError(f"{where}.config.{name}",
                                  "must be a bool, int, string, list of ints or null")
        entries.append(ScheduleEntry(_int(item["step"], f"{where}.step", 0, MAX_DIM),
                                     _str(item["workload_key"], f"{where}.workload_key"),
                                     _str(item["source"], f"{where}.source"),
                                     MappingProxyType(dict(config))))
    return tuple(entries)


def _weights(value: Any, weights_size: int) -> tuple[WeightEntry, ...]:
    entries = []
    keys: set[str] = set()
    for name, raw in _object(value, "weights").items():
        where = f"weights.{name}"
        item = _object(raw, where)
        _keys(item, where, required={"key", "offset", "nbytes", "dtype", "shape"},
              optional=set())
        entry = WeightEntry(name, _str(item["key"], f"{where}.key"),
                            _int(item["offset"], f"{where}.offset", 0, MAX_BYTES),
                            _int(item["nbytes"], f"{where}.nbytes", 0, MAX_BYTES),
                            _dtype(item["dtype"], f"{where}.dtype"),
                            _shape(item["shape"], f"{where}.shape"))
        if entry.key in keys:
            raise SchemaError(f"{where}.key", f"repeats the tensor key {entry.key!r}")
        keys.add(entry.key)
        expected = TensorSpec(name, entry.dtype, entry.shape).nbytes
        if entry.nbytes != expected:
            raise SchemaError(f"{where}.nbytes", f"is {entry.nbytes}, but {entry.dtype}"
                                              f"{list(entry.shape)} takes {expected} bytes")
        if entry.offset + entry.nbytes > weights_size:
            raise SchemaError(f"{where}.offset", f"puts bytes [{entry.offset}, "
                                              f"{entry.offset + entry.nbytes}) outside the "
                                              f"weights blob of weights_size {weights_size}")
        entries.append(entry)
    spans = sorted((e.offset, e.offset + e.nbytes, e.name) for e in entries if e.nbytes)
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        if start < end:
            raise SchemaError(f"weights.{second}.offset", f"overlaps weight {first!r}")
    return tuple(entries)


def _host_nodes(value: Any) -> tuple[HostNodeEntry, ...]:
    entries: list[HostNodeEntry] = []
    for i, raw in enumerate(_list(value, "host_nodes")):
        where = f"host_nodes[{i}]"
        item = _object(raw, where)
        _keys(item, where, required={"index", "op", "name", "reason", "inputs",
                                     "implicit_inputs", "outputs"}, optional=set())
        index = _int(item["index"], f"{where}.index", 0, 1 << 31)
        if entries and index <= entries[-1].index:
            raise SchemaError(f"{where}.index", "must be larger than the previous entry's")
        inputs = _tensor_list(item["inputs"], f"{where}.inputs", named=True)
        implicit = tuple(_str(n, f"{where}.implicit_inputs[{j}]") for j, n in
                         enumerate(_list(item["implicit_inputs"], f"{where}.implicit_inputs")))
        if len(implicit) > len(inputs):
            raise SchemaError(f"{where}.implicit_inputs", "lists more values than the node has "
                                                       "inputs")
        entries.append(HostNodeEntry(index, _str(item["op"], f"{where}.op"),
                                     _str(item["name"], f"{where}.name"),
                                     _str(item["reason"], f"{where}.reason"), inputs, implicit,
                                     _tensor_list(item["outputs"], f"{where}.outputs",
                                                  named=True)))
    return tuple(entries)


def _checks(value: Any) -> tuple[IndexCheck, ...]:
    checks = []
    for i, raw in enumerate(_list(value, "checks")):
        where = f"checks[{i}]"
        item = _object(raw, where)
        _keys(item, where, required={"node_index", "node", "op", "input", "low", "high"},
              optional={"start", "stride", "outside"})
        low = _int(item["low"], f"{where}.low", -(1 << 63), 1 << 63)
        high = _int(item["high"], f"{where}.high", low, 1 << 63)
        stride = _int(item.get("stride", 1), f"{where}.stride", 1, 1 << 31)
        start = _int(item.get("start", 0), f"{where}.start", 0, stride - 1)
        checks.append(IndexCheck(_int(item["node_index"], f"{where}.node_index", 0, 1 << 31),
                                 _str(item["node"], f"{where}.node"),
                                 _str(item["op"], f"{where}.op"),
                                 _str(item["input"], f"{where}.input"), low, high, start,
                                 stride, _bool(item.get("outside", False), f"{where}.outside")))
    return tuple(checks)


# ---------------------------------------------------------------------- field checks


def tensor_spec(value: Any, where: str, named: bool) -> TensorSpec:
    """A ``{"name"?, "dtype", "shape"}`` object (the manifest's and the signature's form)."""
    item = _object(value, where)
    _keys(item, where, required={"dtype", "shape"} | ({"name"} if named else set()),
          optional=set())
    spec = TensorSpec(_str(item["name"], f"{where}.name") if named else "",
                      _dtype(item["dtype"], f"{where}.dtype"), _shape(item["shape"],
                                                                      f"{where}.shape"))
    if spec.nbytes > MAX_BYTES:
        raise SchemaError(f"{where}.shape", f"makes a buffer of {spec.nbytes:,} bytes, more than "
                                         f"{MAX_BYTES:,}")
    return spec


def _tensor_list(value: Any, where: str, named: bool) -> tuple[TensorSpec, ...]:
    return tuple(tensor_spec(item, f"{where}[{i}]", named)
                 for i, item in enumerate(_list(value, where)))


def _keys(item: dict[str, Any], where: str, required: set[str],
          optional: set[str] | None) -> None:
    """``optional=None`` allows any other key (informational fields)."""
    prefix = f"{where}." if where else ""
    missing = sorted(required - set(item))
    if missing:
        raise SchemaError(prefix + missing[0], "is missing")
    if optional is not None:
        unknown = sorted(set(item) - required - optional)
        if unknown:
            raise SchemaError(prefix + unknown[0], "is not a field of this format version")


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SchemaError(where, f"must be a JSON object, found a JSON {_json_kind(value)}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise SchemaError(where, f"must be a JSON list, found a JSON {_json_kind(value)}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise SchemaError(where, f"must be a string, found a JSON {_json_kind(value)}")
    return value


def _int(value: Any, where: str, low: int, high: int) -> int:
    """An integer in ``[low, high]``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise SchemaError(where, f"must be an integer, found a JSON {_json_kind(value)}")
    if not low <= value <= high:
        raise SchemaError(where, f"is {value}, outside [{low}, {high}]")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise SchemaError(where, f"must be true or false, found a JSON {_json_kind(value)}")
    return value


def _dtype(value: Any, where: str) -> str:
    name = _str(value, where)
    if name not in ITEMSIZE:
        raise SchemaError(where, f"names the unknown element type {name!r}")
    return name


def _shape(value: Any, where: str) -> tuple[int, ...]:
    dims = _list(value, where)
    if len(dims) > MAX_RANK:
        raise SchemaError(where, f"has rank {len(dims)}, more than {MAX_RANK}")
    return tuple(_int(d, f"{where}[{i}]", 0, MAX_DIM) for i, d in enumerate(dims))


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (int, float)):
        return "number"
    return "null" if value is None else type(value).__name__
