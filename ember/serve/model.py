"""A model as the server sees it: loaded copies for the workers, request checks, batches.

A batch-blocked artifact (``ember.runtime.BatchBlockedModel``) runs any batch size, so requests
for it can be joined along the batch axis: a request's batch inputs may hold any number of
samples, and requests whose other dims, element types and non-batch inputs agree share a
*batch key* and can run as one call.  An artifact compiled for fixed shapes runs each request
alone (its inputs must have exactly those shapes).  ember never pads a request to make it fit
another's shape: only the model knows whether padding changes its answer, so requests of
different shapes are simply batched apart.
"""

from __future__ import annotations

import hashlib
import os
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, Sequence

import numpy as np

import ember.runtime
from ember.runtime import BatchBlockedModel, EmberError, ExecutionError, InputError, TensorSpec
from ember.runtime.blocks import plan_blocks
from ember.runtime.dtypes import numpy_dtype
from ember.serve.protocol import InferRequest, ProtocolError, datatype_of

# Padding a batch must promise at least this share of time saved.
PAD_GAIN = 0.9
BLOCK_TIMING_CALLS = 3
# What a model may be called in a URL: /v2/models/{name}/infer.
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")


@dataclass
class Prepared:
    """A request checked against the model: its arrays, samples and batch key."""

    request: InferRequest
    inputs: dict[str, np.ndarray]
    samples: int
    key: Hashable
    outputs: list[str]


# The result of one request in a batch: its outputs by name, or the error it ran into.
Result = dict[str, np.ndarray] | BaseException


class ServedModel:
    """One artifact served under ``name``, loaded once per worker.

    Each worker owns one loaded copy (its own workspace; copies of one artifact share the
    weights and the library, whose thread pool runs one call's parallel loops at a time and
    a concurrent call's serially, so workers never multiply the threads).  ``threads``: the threads of each
    copy's kernels (default: the CPUs this process may use, divided among the workers).

    A batch runs in the artifact's blocks; when running it padded up to a larger block is
    cheaper than the blocks it would otherwise take -- a batch of 15 with blocks of 16, 8, 4,
    2 and 1 is four calls, where one call of 16 may cost less than the four (a model whose
    weights stream from memory on every call) or more (one whose every sample is compute) --
    it is padded with copies of its last sample, whose outputs are dropped.  Samples are
    independent in a batch-blocked artifact, so padding never changes another sample's
    answer.  The choice rests on each block's call time, measured at load on inputs of zeros
    (``time_blocks=False``, or a model that refuses zeros: never padded).
    """

    def __init__(self, name: str, path: str | Path, *, digest: str | None = None,
                 workers: int = 1, threads: int | None = None, time_blocks: bool = True,
                 loader: Callable[..., Any] = ember.runtime.load):
        if not MODEL_NAME.match(name):
            raise EmberError(f"model name {name[:60]!r} is not usable in a URL: use letters, "
                             f"digits, '_', '.' and '-' (up to 128, starting with a letter or "
                             f"digit), e.g. NAME=PATH on the command line")
        if workers < 1:
            raise EmberError(f"model '{name}': workers must be at least 1, not {workers}")
        if threads is None:
            threads = max(1, len(os.sched_getaffinity(0)) // workers)
        self.name = name
        self.path = Path(path)
        shared: dict = {}  # the workers' copies share one copy of the weights
        first = loader(path, expected_digest=digest, threads=threads, weights_cache=shared)
        # the other copies are pinned to the first one's bytes (the loader refuses others)
        self.instances = [first] + [
            loader(path, expected_digest=first.digest, threads=threads, weights_cache=shared)
            for _ in range(workers - 1)]
        self.digest: str = first.digest
        self.inputs: tuple[TensorSpec, ...] = first.inputs
        self.outputs: tuple[TensorSpec, ...] = first.outputs
        blocked = isinstance(first, BatchBlockedModel)
        self.batch_inputs = frozenset(first.batch_inputs if blocked else ())
        self.batch_outputs = frozenset(first.index.batch_outputs if blocked else ())
        # the batch outputs whose batch is not their first axis (a recurrent layer's states)
        self._output_axes = dict(first.index.output_axes if blocked else ())
        self._dtypes = {spec.name: numpy_dtype(spec.dtype) for spec in self.inputs}
        self._output_names = [spec.name for spec in self.outputs]
        for spec in (*self.inputs, *self.outputs):
            datatype_of(numpy_dtype(spec.dtype))  # refuses a model the protocol cannot carry
        # seconds of a call of each compiled block size (empty: batches are never padded)
        self.block_seconds: dict[int, float] = \
            self._time_blocks(first) if blocked and time_blocks else {}

    @property
    def batchable(self) -> bool:
        """Whether requests can be joined along a batch axis."""
        return bool(self.batch_inputs)

    def metadata(self) -> dict[str, Any]:
        """The protocol's model metadata: a batch dim is -1 (any size)."""
        def tensors(specs: Sequence[TensorSpec], batched: frozenset[str]) -> list[dict]:
            described = []
            for spec in specs:
                shape = list(spec.shape)
                if spec.name in batched:
                    shape[self._output_axes.get(spec.name, 0)] = -1
                described.append({"name": spec.name, "shape": shape,
                                  "datatype": datatype_of(numpy_dtype(spec.dtype))})
            return described

        return {"name": self.name, "versions": ["1"], "platform": "ember",
                "inputs": tensors(self.inputs, self.batch_inputs),
                "outputs": tensors(self.outputs, self.batch_outputs)}

    # ---------------------------------------------------------------- checking requests
    def prepare(self, request: InferRequest) -> Prepared:
        """Check a request's inputs and requested outputs against the model (a
        :class:`ProtocolError` naming the input and what the model takes), and give its batch
        key: requests of one key can run as one call."""
        unknown = sorted(set(request.inputs) - set(self._dtypes))
        if unknown:
            raise ProtocolError(f"model '{self.name}' has no input(s) {unknown}; its inputs "
                                f"are {list(self._dtypes)}")
        missing = [name for name in self._dtypes if name not in request.inputs]
        if missing:
            raise ProtocolError(f"model '{self.name}' needs input(s) {missing} as well")
        samples: int | None = None
        shared: list[Hashable] = []
        for spec in self.inputs:
            array = request.inputs[spec.name]
            expected = self._dtypes[spec.name]
            if array.dtype != expected:
                raise ProtocolError(f"input '{spec.name}' is {datatype_of(array.dtype)}; model "
                                    f"'{self.name}' takes {datatype_of(expected)}")
            if spec.name in self.batch_inputs:
                if array.ndim != len(spec.shape) or array.shape[1:] != spec.shape[1:] or \
                        array.shape[0] < 1:
                    wanted = ["N", *map(str, spec.shape[1:])]
                    raise ProtocolError(f"input '{spec.name}' has shape {list(array.shape)}; "
                                        f"model '{self.name}' takes [{', '.join(wanted)}] "
                                        f"with any batch size N >= 1")
                if samples is not None and array.shape[0] != samples:
                    raise ProtocolError(f"input '{spec.name}' holds {array.shape[0]} samples, "
                                        f"the other batch inputs {samples}")
                samples = array.shape[0]
            else:
                if array.shape != spec.shape:
                    raise ProtocolError(f"input '{spec.name}' has shape {list(array.shape)}; "
                                        f"model '{self.name}' takes {list(spec.shape)}")
                shared.append((spec.name, hashlib.blake2b(
                    np.ascontiguousarray(array).tobytes(), digest_size=16).digest()))
        outputs = self._output_names if request.outputs is None else request.outputs
        unknown = sorted(set(outputs) - set(self._output_names))
        if unknown:
            raise ProtocolError(f"model '{self.name}' has no output(s) {unknown}; its outputs "
                                f"are {self._output_names}")
        # A model without batch inputs runs each request alone: a key of its own.
        key: Hashable = tuple(shared) if samples is not None else object()
        return Prepared(request, dict(request.inputs), samples or 1, key, list(outputs))

    # ---------------------------------------------------------------- running
    def run_batch(self, worker: int, batch: Sequence[Prepared]) -> list[Result]:
        """Run requests of one batch key as one call on worker ``worker``'s copy; each
        request's outputs, or its own error.  Runs on the worker's thread.

        When the joined call fails (an input value a kernel refuses: an index out of range),
        each request runs alone, so one bad request fails only itself.
        """
        model = self.instances[worker]
        total = sum(item.samples for item in batch)
        padded = self.padded_size(total)
        if len(batch) == 1 and padded == total:
            return [self._run_one(model, batch[0])]
        feeds = {}
        for name in self._dtypes:
            if name not in self.batch_inputs:
                feeds[name] = batch[0].inputs[name]
                continue
            parts = [item.inputs[name] for item in batch]
            if padded > total:
                last = parts[-1][-1:]
                parts.append(np.broadcast_to(last, (padded - total, *last.shape[1:])))
            feeds[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
        try:
            outputs = model.run(feeds)
        except EmberError:
            return [self._run_one(model, item) for item in batch]
        results: list[Result] = []
        start = 0
        for item in batch:
            mine = {}
            for name in item.outputs:
                value = outputs[name]
                if name in self.batch_outputs:
                    axis = self._output_axes.get(name, 0)
                    rows = value.shape[axis] // padded
                    value = value[(slice(None),) * axis +
                                  (slice(rows * start, rows * (start + item.samples)),)]
                mine[name] = value
            results.append(mine)
            start += item.samples
        return results

    def padded_size(self, samples: int) -> int:
        """The samples to run a batch of ``samples`` as: itself, or more when padding its
        remainder up to one block is expected to take under 0.9 of the time of the blocks it
        would otherwise run in."""
        costs = self.block_seconds
        if not costs or samples in costs:
            return samples
        largest = max(costs)
        whole, rest = divmod(samples, largest)
        blocks = plan_blocks(rest, costs)
        if not rest or blocks is None:
            return samples
        split_cost = sum(costs[size] for size in blocks)
        size, cost = min(((size, cost) for size, cost in costs.items() if size > rest),
                         key=lambda item: item[1])
        return whole * largest + size if cost < PAD_GAIN * split_cost else samples

    def _time_blocks(self, model: BatchBlockedModel) -> dict[int, float]:
        """Seconds of one call of each block, the median of a few on inputs of zeros; empty
        when a call fails (a model whose kernels refuse zeros)."""
        seconds = {}
        for size in model.block_sizes:
            feeds = {spec.name: np.zeros((size, *spec.shape[1:]) if spec.name in
                                         self.batch_inputs else spec.shape,
                                         numpy_dtype(spec.dtype)) for spec in self.inputs}
            times = []
            try:
                for _ in range(1 + BLOCK_TIMING_CALLS):
                    start = time.perf_counter()
                    model.run(feeds)
                    times.append(time.perf_counter() - start)
            except EmberError:
                return {}
            seconds[size] = statistics.median(times[1:])
        return seconds

    def _run_one(self, model: Any, item: Prepared) -> Result:
        try:
            outputs = model.run(item.inputs)
        except (InputError, ExecutionError) as error:
            return ProtocolError(f"model '{self.name}' could not run this request: {error}")
        except Exception as error:  # a bug: the client gets a 500, the others their results
            return error
        return {name: outputs[name] for name in item.outputs}
