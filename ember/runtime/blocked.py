"""Batch-blocked artifacts: one saved model that runs any batch size.

A model whose graph keeps the samples of its batch apart (``ember.passes.batch_split``) is
served from code compiled for a few block sizes (:mod:`ember.runtime.blocks`).  Saved, it is a
directory of ordinary artifacts, one per block size, and an index::

    model.ember/
      blocks.json     format, model name, which inputs and outputs carry the batch (and
                      the axis of outputs whose batch is not first), and the
                      block sizes with the manifest digest of each block's artifact; sealed
                      with its own digest (``manifest_sha256``), which so covers every file
      b16/            an artifact (ember.runtime.artifact) compiled for 16 samples
      b1/             ... and one for a single sample, so that every batch size is served

The directory names are made here from the validated sizes (``b`` and the integer), never read
from a file; each block directory is opened inside the parent without following links and
read with the digest the index gives, so a block cannot be swapped or edited alone.  The
blocks must agree: the same inputs and outputs in the same order, with the same element types,
shapes that differ only in the batch dim of the batch inputs and outputs, and that dim equal
to the block size (times the same rows per sample, for outputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ember.runtime.artifact import read_artifact_in
from ember.runtime.binding import (as_array, bind_call, bind_outputs, bind_run, call_result,
                                   check_array)
from ember.runtime.blocks import check_block_outputs, plan_blocks, run_in_blocks
from ember.runtime.dtypes import numpy_dtype
from ember.runtime.errors import ExecutionError, InputError, ModelLoadError
from ember.runtime.files import ArtifactDirectory
from ember.runtime.manifest import (DIGEST_FIELD, SchemaError, TensorSpec, _int, _keys, _list,
                                    _object, _str, check_header, strict_json, verify_digest)
from ember.runtime.model import CompiledModel, HostResolver, WeightsCache, check_thread_count
from ember.runtime.profiling import StepTimes

BLOCKS_FILE = "blocks.json"
BLOCKS_FORMAT = "ember-batch-blocks"
BLOCKS_FORMAT_VERSION = 1
# Version 2 adds ``batch_output_axes``; an index without batch outputs of another axis is
# still written as version 1, which runtimes from before version 2 read.
BLOCKS_FORMAT_VERSION_AXES = 2
MAX_AXIS = 32
MAX_BLOCKS_BYTES = 1 << 20
MAX_BLOCKS = 64
MAX_BLOCK_SIZE = 1 << 20
_REMEDY = "the artifact is malformed or was edited; save it again with this ember"
_TOP_LEVEL = {"format", "format_version", "ember_version", "model", "batch_inputs",
              "batch_outputs", "blocks", DIGEST_FIELD}
_AXES_FIELD = "batch_output_axes"


def block_directory(size: int) -> str:
    """The directory of the block of ``size`` samples (made from the integer alone)."""
    return f"b{int(size)}"


@dataclass(frozen=True)
class BlockIndex:
    """A validated blocks.json."""

    model: str
    ember_version: str
    batch_inputs: tuple[str, ...]
    batch_outputs: tuple[str, ...]
    blocks: tuple[tuple[int, str], ...]  # (size, manifest digest of its artifact), largest first
    digest: str
    output_axes: tuple[tuple[str, int], ...] = ()  # batch outputs whose batch is not first


def parse_block_index(data: Any, source: str) -> BlockIndex:
    """Check the format, the digest and the schema of a parsed blocks.json."""
    version = data.get("format_version") if isinstance(data, dict) else None
    readable = BLOCKS_FORMAT_VERSION_AXES if version == BLOCKS_FORMAT_VERSION_AXES else \
        BLOCKS_FORMAT_VERSION  # (check_header refuses any other, bools included)
    check_header(data, source, BLOCKS_FORMAT, readable,
                 kind="the index of a batch-blocked ember artifact",
                 format_name="batch-blocked artifact")
    digest = verify_digest(data, source)
    try:
        return _parse(data, digest)
    except SchemaError as error:
        raise ModelLoadError(f"{source}: field '{error.field}' {error.problem}; {_REMEDY}") \
            from None


def _parse(data: dict[str, Any], digest: str) -> BlockIndex:
    with_axes = data["format_version"] == BLOCKS_FORMAT_VERSION_AXES
    _keys(data, "", required=_TOP_LEVEL - {DIGEST_FIELD} | ({_AXES_FIELD} if with_axes
                                                             else set()),
          optional={DIGEST_FIELD})
    batch_inputs = _names(data["batch_inputs"], "batch_inputs")
    if not batch_inputs:
        raise SchemaError("batch_inputs", "is empty: some input must carry the batch")
    blocks = []
    for i, item in enumerate(_list(data["blocks"], "blocks")):
        where = f"blocks[{i}]"
        block = _object(item, where)
        _keys(block, where, required={"size", "manifest_sha256"}, optional=set())
        size = _int(block["size"], f"{where}.size", 1, MAX_BLOCK_SIZE)
        block_digest = _str(block["manifest_sha256"], f"{where}.manifest_sha256")
        if len(block_digest) != 64 or any(c not in "0123456789abcdef" for c in block_digest):
            raise SchemaError(f"{where}.manifest_sha256", "must be a lowercase SHA-256 hex "
                                                          "digest")
        blocks.append((size, block_digest))
    sizes = [size for size, _ in blocks]
    if not 1 <= len(blocks) <= MAX_BLOCKS:
        raise SchemaError("blocks", f"lists {len(blocks)} blocks; 1 to {MAX_BLOCKS} expected")
    if len(set(sizes)) != len(sizes):
        raise SchemaError("blocks", f"repeats a block size ({sizes})")
    if 1 not in sizes:
        raise SchemaError("blocks", f"has no block of 1 sample (sizes {sizes}), so some batch "
                                    f"sizes could not be served")
    batch_outputs = _names(data["batch_outputs"], "batch_outputs")
    output_axes = []
    if with_axes:
        for name, axis in _object(data[_AXES_FIELD], _AXES_FIELD).items():
            where = f"{_AXES_FIELD}.{name}"
            if name not in batch_outputs:
                raise SchemaError(where, "names no batch output")
            output_axes.append((name, _int(axis, where, 1, MAX_AXIS)))
    return BlockIndex(model=_str(data["model"], "model"),
                      ember_version=_str(data["ember_version"], "ember_version"),
                      batch_inputs=batch_inputs, batch_outputs=batch_outputs,
                      blocks=tuple(sorted(blocks, reverse=True)), digest=digest,
                      output_axes=tuple(output_axes))


def _names(value: Any, where: str) -> tuple[str, ...]:
    names = tuple(_str(item, f"{where}[{i}]") for i, item in enumerate(_list(value, where)))
    if len(set(names)) != len(names):
        raise SchemaError(where, "repeats a name")
    return names


class BatchBlockedModel:
    """A loaded batch-blocked artifact: any batch size, run as blocks of the compiled sizes.

    The call contract is :class:`CompiledModel`'s (``model(*arrays)``, ``model.run(feeds)``);
    ``inputs`` and ``outputs`` describe the largest block, and the first dim of the inputs
    named in ``batch_inputs`` may be any positive size (the same for all of them).
    """

    def __init__(self, path: str | Path, host_resolver: HostResolver | None = None, *,
                 expected_digest: str | None = None, threads: int | None = None,
                 weights_cache: WeightsCache | None = None):
        threads = check_thread_count(threads)
        with ArtifactDirectory(path) as directory:
            self.path = directory.root
            where = f"artifact '{self.path}': '{BLOCKS_FILE}'"
            index = parse_block_index(
                strict_json(directory.read(BLOCKS_FILE, MAX_BLOCKS_BYTES), where), where)
            if expected_digest is not None and index.digest != expected_digest.lower():
                raise ModelLoadError(f"artifact '{self.path}' is not the expected one: its "
                                     f"digest is {index.digest}, expected {expected_digest}")
            blocks: list[tuple[int, CompiledModel]] = []
            # blocks with the same weights share one blob
            weights = {} if weights_cache is None else weights_cache
            for size, block_digest in index.blocks:
                with directory.subdirectory(block_directory(size)) as part:
                    artifact = read_artifact_in(part, block_digest)
                blocks.append((size, CompiledModel(artifact, host_resolver, threads=threads,
                                                   weights_cache=weights)))
        self.index = index
        self.blocks = blocks
        self.inputs: tuple[TensorSpec, ...] = blocks[0][1].inputs
        self.outputs: tuple[TensorSpec, ...] = blocks[0][1].outputs
        _check_blocks(index, blocks, f"artifact '{self.path}'")
        self._runners = {size: model._run for size, model in blocks}
        # how a batch input is spelled in messages: float32[N, 16]
        self._batch_expected = {
            spec.name: f"{spec.dtype}[{', '.join(['N', *map(str, spec.shape[1:])])}]"
            for spec in self.inputs if spec.name in index.batch_inputs}

    @property
    def digest(self) -> str:
        """The digest of blocks.json, which pins every block (``expected_digest``)."""
        return self.index.digest

    @property
    def block_sizes(self) -> list[int]:
        return [size for size, _ in self.blocks]

    @property
    def batch_inputs(self) -> tuple[str, ...]:
        return self.index.batch_inputs

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [spec.name for spec in self.outputs]

    def set_num_threads(self, count: int | None) -> None:
        """Threads every block's kernels run on (see ``CompiledModel.set_num_threads``)."""
        for _, model in self.blocks:
            model.set_num_threads(count)

    @property
    def num_threads(self) -> int:
        return self.blocks[0][1].num_threads

    def thread_stats(self) -> dict[str, int]:
        """The thread-pool counters of the blocks' libraries, added up."""
        total: dict[str, int] = {}
        for _, model in self.blocks:
            for key, value in model.thread_stats().items():
                total[key] = total.get(key, 0) + value
        return total

    def run(self, feeds: Any, *, out: Any = None) -> dict[str, np.ndarray]:
        """Run on a dict name -> array (or a list/tuple in input order); outputs by name.
        ``out``: arrays to write the outputs into, as for :meth:`__call__`."""
        return self._run(bind_run(self.input_names, feeds), self._given(out))

    def __call__(self, /, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        """Run on positional and/or named arrays: the output array of a one-output model,
        else a tuple of arrays in output order.  ``out``: arrays to write the outputs
        into, as for ``CompiledModel.__call__``, of this call's shapes (a batch output
        holds the rows of every sample of the call)."""
        if out is not None and "out" in self.input_names:
            kwargs["out"], out = out, None
        return call_result(self.output_names,
                           self._run(bind_call(self.input_names, args, kwargs),
                                     self._given(out)))

    def _given(self, out: Any) -> dict[str, Any]:
        """The caller-given outputs of ``out=``, by name (unchecked)."""
        targets = bind_outputs(self.output_names, out)
        return {} if targets is None else \
            {name: array for name, array in zip(self.output_names, targets) if array is not None}

    def profile(self, feeds: Any, repeat: int = 10, warmup: int = 2) -> StepTimes:
        """Time every step of the block whose size is the batch of ``feeds``."""
        arrays, batch = self._checked(bind_run(self.input_names, feeds))
        for size, model in self.blocks:
            if size == batch:
                return model.profile(arrays, repeat=repeat, warmup=warmup)
        raise ExecutionError(f"compiled model '{self.path.name}' profiles one block at a time: "
                             f"give a batch of {' or '.join(map(str, self.block_sizes))} "
                             f"samples, not {batch}")

    def _run(self, feeds: Mapping[str, Any], out: Mapping[str, Any] | None = None
             ) -> dict[str, np.ndarray]:
        """Run on inputs bound by name; ``out``: caller-given arrays of some outputs, by
        name, of the whole call's shapes (checked here)."""
        arrays, batch = self._checked(feeds)
        sizes = plan_blocks(batch, self.block_sizes)
        assert sizes is not None  # a block of 1 exists (checked at load)
        axes = dict(self.index.output_axes)
        checked = out and check_block_outputs(out, self.outputs, self.blocks[0][0], batch,
                                               self.index.batch_outputs, axes)
        if len(sizes) == 1:  # a batch of a block's size: that block alone, on the inputs
            result = self._runners[batch](arrays, checked)
        else:
            result = run_in_blocks(arrays, self.index.batch_inputs, self.index.batch_outputs,
                                   [(size, self._runners[size]) for size in sizes], checked,
                                   axes)
        if out:
            result.update(out)  # the caller's very arrays
        return result

    def _checked(self, feeds: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
        """The inputs as arrays of the right element types and shapes, and the batch size."""
        arrays: dict[str, np.ndarray] = {}
        batch: int | None = None
        for spec in self.inputs:
            dtype = numpy_dtype(spec.dtype)
            value = feeds[spec.name]
            if spec.name not in self.index.batch_inputs:
                array = value if type(value) is np.ndarray else \
                    as_array(spec.name, value, spec.describe())
                check_array(spec.name, array, dtype, spec.shape)
                arrays[spec.name] = array
                continue
            expected = self._batch_expected[spec.name]
            array = value if type(value) is np.ndarray else as_array(spec.name, value, expected)
            if array.ndim != len(spec.shape) or array.shape[1:] != spec.shape[1:]:
                raise InputError(f"input '{spec.name}' has shape {tuple(array.shape)}; the "
                                 f"compiled model expects {expected} (any batch size N)")
            check_array(spec.name, array, dtype, array.shape)
            if batch is not None and array.shape[0] != batch:
                raise InputError(f"input '{spec.name}' has a batch of {array.shape[0]}, "
                                 f"the other batch inputs have {batch}")
            batch = array.shape[0]
            arrays[spec.name] = array
        assert batch is not None  # batch_inputs is not empty (checked at load)
        if batch == 0:
            raise InputError(f"the inputs {list(self.index.batch_inputs)} hold a batch of 0 "
                             f"samples; the compiled blocks run at least 1")
        return arrays, batch


def _check_blocks(index: BlockIndex, blocks: list[tuple[int, CompiledModel]],
                  where: str) -> None:
    """The blocks agree with the index and with each other (see the module docstring)."""
    first_size, first = blocks[0]
    names = [spec.name for spec in first.inputs]
    outputs = [spec.name for spec in first.outputs]
    for kind, listed, known in (("batch input", index.batch_inputs, names),
                                ("batch output", index.batch_outputs, outputs)):
        unknown = sorted(set(listed) - set(known))
        if unknown:
            raise ModelLoadError(f"{where}: {BLOCKS_FILE} names the {kind}(s) {unknown}, which "
                                 f"the blocks do not have; {_REMEDY}")
    rows: dict[str, int] = {}
    axes = dict(index.output_axes)
    for size, model in blocks:
        label = f"{where}: block '{block_directory(size)}'"
        for kind, specs, reference, batched, per_sample in (
                ("input", model.inputs, first.inputs, index.batch_inputs, False),
                ("output", model.outputs, first.outputs, index.batch_outputs, True)):
            if [(s.name, s.dtype, len(s.shape)) for s in specs] != \
                    [(s.name, s.dtype, len(s.shape)) for s in reference]:
                raise ModelLoadError(f"{label} has other {kind}s than block "
                                     f"'{block_directory(first_size)}'; {_REMEDY}")
            for spec, ref in zip(specs, reference):
                if spec.name not in batched:
                    if spec.shape != ref.shape:
                        raise ModelLoadError(f"{label}: {kind} '{spec.name}' is "
                                             f"{spec.describe()}, not {ref.describe()} as in "
                                             f"the other blocks; {_REMEDY}")
                    continue
                axis = axes.get(spec.name, 0) if per_sample else 0
                if len(spec.shape) <= axis or \
                        spec.shape[:axis] + spec.shape[axis + 1:] != \
                        ref.shape[:axis] + ref.shape[axis + 1:]:
                    raise ModelLoadError(f"{label}: {kind} '{spec.name}' is {spec.describe()}, "
                                         f"which does not match the other blocks but in its "
                                         f"batch; {_REMEDY}")
                count = spec.shape[axis] // size if spec.shape[axis] % size == 0 else -1
                expected = rows.setdefault(spec.name, count) if per_sample else 1
                if count != expected or count < 1:
                    raise ModelLoadError(f"{label}: {kind} '{spec.name}' is {spec.describe()}, "
                                         f"which does not hold {size} samples; {_REMEDY}")
