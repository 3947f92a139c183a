"""The public entry points: ``compile``, ``load`` and the compiled ``Module``.

    module = ember.compile("resnet18.onnx")          # or a ModelProto, or an ember Graph
    module = ember.compile(torch_module, (x,))       # or a torch.nn.Module, via torch.export
    y = module(x)                                    # numpy in, numpy out
    module.save("resnet18.ember")                    # artifact: library + weights + manifest
    same = ember.load("resnet18.ember")
    print(module.profile(x).table())                 # time, FLOPs, bytes of every kernel

A model with dynamic dims is compiled for the shapes of its first call (or ``input_shapes``).
When the graph keeps the samples of its batch apart (``ember.passes.batch_split``), a call with
another batch size reuses that code block by block (a batch-1 specialization is compiled once
for the remainders): every batch size is served by at most two specializations.  When the
graph has other dynamic dims (a sequence length) and their symbols hide what it does with the
batch (``x[:, :1]`` of a symbolic length), the question is asked again with those dims bound
to the call's sizes.  Other dynamic dims, and graphs that mix samples, get a specialization
per input shape, as torch.compile does without dynamic shapes.  ``dynamic_batch=False`` (or
``EMBER_DYNAMIC_BATCH=0``) asks for a specialization per batch size too.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ember.driver.pipeline import Build, BuildOptions, build_graph
from ember.frontend import import_model, is_torch_module
from ember.core.traced import SizeTrace
from ember.dynamic_dims import (MAX_REFUSED_TRACES, RUNTIME_DIMS_ENV, GuardFailed, NotTraceable,
                                TracedVariant, build_traced, runtime_dims_enabled, runtime_for,
                                traced_symbols)
from ember.core.config import env_flag, parse_size
from ember.core.dims import SymDim, single_symbol
from ember.core.errors import EmberError, InputError, UnsupportedOpError
from ember.core.target import Target
from ember.ir.graph import Graph
from ember.ir.types import TensorType
from ember.passes.batch_split import (BatchSplit, NotSeparable, analyze_batch_split,
                                      analyze_batch_split_at, batch_symbol,
                                      mentions_other_symbols)
from ember.runtime.binding import as_array, bind_call, bind_outputs, bind_run, call_result
from ember.runtime.blocked import MAX_BLOCK_SIZE, MAX_BLOCKS, BatchBlockedModel
from ember.runtime.blocks import check_block_outputs, plan_blocks, run_in_blocks
from ember.runtime.loader import load as load_artifact
from ember.runtime.errors import ModelLoadError
from ember.runtime.manifest import HostNodeEntry
from ember.runtime.dims_model import RuntimeDimsModel
from ember.runtime.model import CompiledModel, HostFunction, check_thread_count
from ember.schedule.config import KernelConfig, ScheduleConfigError

if TYPE_CHECKING:
    from ember.package.c_api import DimsSpec
    from ember.package.export import ExportResult
    from ember.profile import Peak, Profile

LOG = logging.getLogger("ember")
DYNAMIC_BATCH_ENV = "EMBER_DYNAMIC_BATCH"


class Module:
    """A compiled model: call it on numpy arrays; ``save`` writes an artifact.

    ``module(*arrays, **named)`` returns the output array of a one-output model, else a tuple
    of arrays in output order; ``module.run(feeds)`` takes a dict name -> array (or a
    list/tuple in input order) and returns a dict name -> array -- the call contract of the
    runtime's ``CompiledModel`` too (:mod:`ember.runtime.binding`).  Thread-safe: concurrent
    first calls with a new input shape compile that variant once.
    """

    def __init__(self, graph: Graph, options: BuildOptions,
                 input_shapes: Mapping[str, Sequence[int]] | None = None,
                 dynamic_batch: bool | None = None, allow_fallbacks: bool = True):
        self.graph = graph
        self.options = options
        # Whether nodes without a compiled kernel may run as numpy references (then the
        # artifact needs ember.load(), not the bare runtime); if not, a build with any is an
        # UnsupportedOpError listing them all.
        self.allow_fallbacks = allow_fallbacks
        self._variants: dict[tuple, tuple[Build, CompiledModel]] = {}
        # Variants being compiled, so that concurrent first calls wait instead of compiling
        # the same shapes again; the lock guards both dicts and _num_threads.
        self._pending: dict[tuple, Future] = {}
        # (dtype, shape) of each input -> its variant, for calls whose inputs were seen before
        self._by_call_key: dict[tuple, tuple[Build, CompiledModel]] = {}
        # the same for calls that run in batch blocks: their plan (with the current build and
        # shapes planning left, restored as the full path would leave them), so that a call
        # does not check every traced build's guards again (half a small transformer's call)
        self._plans_by_call_key: dict[tuple, tuple[_BlockPlan, Any, Any]] = {}
        # (call key, variant, shapes) of the last call __call__ sent straight to a variant
        self._last_call: tuple | None = None
        self._variants_lock = threading.Lock()
        self._last: tuple[Build, CompiledModel] | None = None
        self._num_threads: int | None = None
        # How a batch of any size is served from compiled blocks (None: a specialization per
        # batch size; ``batch_split_reason`` says why), and the block sizes compiled so far
        # for each shape of the other dims.
        self.batch_split: BatchSplit | None = None
        self.batch_split_reason = ""
        self._block_sizes: dict[tuple, set[int]] = {}
        # When the symbolic graph could not be decided but has other dynamic dims: the
        # split decided with those dims bound, per their sizes (None: not separable).
        self._split_at_sizes = False
        self._splits_at_sizes: dict[tuple, BatchSplit | None] = {}
        # Why each build was needed, in order (also logged at INFO with the build).
        self.build_reasons: list[str] = []
        # Builds that take the non-batch dims at run time (ember.dynamic_dims); the first
        # traces of the refused attempts (sizes that satisfy their guards are not traced
        # again) and why the last was refused; and why the module no longer traces at all
        # ("" while it does).
        self._traced: list[TracedVariant] = []
        self._refused: list[tuple[SizeTrace, str]] = []
        self._refusals = 0
        self.last_refusal = ""
        self.runtime_dims_reason = "" if runtime_dims_enabled() else \
            f"{RUNTIME_DIMS_ENV} is 0"
        self._last_shapes: dict[str, tuple[int, ...]] | None = None
        # Every set of input shapes the module compiled or ran code for, in order: ``save``
        # refuses to drop any of them silently (an artifact holds code for one shape of the
        # dims other than the batch).
        self._shapes_seen: dict[tuple, dict[str, tuple[int, ...]]] = {}
        if not self._all_static():
            self._plan_batch_split(dynamic_batch)
        if input_shapes is not None or self._all_static():
            self._variant(self._shapes_from(input_shapes or {}))

    # ------------------------------------------------------------------ building
    def _plan_batch_split(self, dynamic_batch: bool | None) -> None:
        if dynamic_batch is None:
            dynamic_batch = env_flag(DYNAMIC_BATCH_ENV, default=True)
        if not dynamic_batch:
            self.batch_split_reason = "dynamic_batch is off"
            return
        try:
            self.batch_split = analyze_batch_split(self.graph)
        except NotSeparable as why:
            self.batch_split_reason = str(why)
            if mentions_other_symbols(self.graph):
                self._split_at_sizes = True  # decided again at the first call's sizes
            else:
                LOG.info("%s: a specialization per batch size: %s", self.graph.name,
                         why)
        except EmberError as error:  # the graph is broken; compiling it will say so
            self.batch_split_reason = f"not analysed: {error}"

    def _split_for(self, shapes: dict[str, tuple[int, ...]]) -> BatchSplit | None:
        """How calls with these sizes of the non-batch dims are served in blocks (None: a
        specialization per batch size)."""
        if not self._split_at_sizes:
            return self.batch_split
        symbol = batch_symbol(self.graph)
        key = tuple(sorted((name, tuple(size for dim, size in zip(
            self.graph.types[name].shape, shape)
            if not (isinstance(dim, SymDim) and symbol in dim.symbols)))
            for name, shape in shapes.items()))
        with self._variants_lock:
            if key in self._splits_at_sizes:
                return self._splits_at_sizes[key]
        sizes = ", ".join(f"{n}{list(s)}" for n, s in shapes.items())
        try:
            split: BatchSplit | None = analyze_batch_split_at(self.graph, shapes)
            reason = f"decided with the other dims bound to the sizes of {sizes}"
            LOG.info("%s: the batch runs in blocks, %s", self.graph.name, reason)
        except NotSeparable as why:
            split, reason = None, str(why)
            LOG.info("%s: a specialization per batch size: %s", self.graph.name, why)
        except EmberError as error:  # the graph is broken; compiling it will say so
            split, reason = None, f"not analysed: {error}"
        with self._variants_lock:
            self._splits_at_sizes.setdefault(key, split)
            self.batch_split, self.batch_split_reason = split, reason
            return self._splits_at_sizes[key]

    def _all_static(self) -> bool:
        return all(isinstance(self.graph.types.get(n), TensorType)
                   and self.graph.types[n].is_static for n in self.graph.inputs)

    def _shapes_from(self, given: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        shapes = {}
        for name in self.graph.inputs:
            if name in given:
                shapes[name] = tuple(int(d) for d in given[name])
            else:
                vtype = self.graph.types.get(name)
                if isinstance(vtype, TensorType) and vtype.is_static:
                    shapes[name] = tuple(vtype.shape)
        return shapes

    def _variant(self, shapes: dict[str, tuple[int, ...]], traced: bool = True
                 ) -> tuple[Build, CompiledModel]:
        """The build that runs these shapes: a specialization compiled for them, or (with
        ``traced``) a build that takes their dynamic dims at run time; compiled if none."""
        key = tuple(sorted(shapes.items()))
        self._last_shapes = shapes
        with self._variants_lock:
            self._shapes_seen.setdefault(key, dict(shapes))
        if traced:
            served = self._traced_variant_for(shapes)
            if served is not None:
                self._last = served
                return served
        with self._variants_lock:
            ready = self._variants.get(key)
            if ready is not None and not traced and isinstance(ready[1], RuntimeDimsModel):
                ready = None    # a specialization is asked for (to save, to profile)
            pending = self._pending.get(key) if ready is None else None
            owner = ready is None and pending is None
            if owner:
                pending = self._pending[key] = Future()
        if ready is None:
            assert pending is not None
            if not owner:
                ready = pending.result()  # another thread compiles it; its error is ours
                if not traced and isinstance(ready[1], RuntimeDimsModel):
                    ready = self._build_variant(shapes)
            else:
                try:
                    ready = (self._build_traced_variant(shapes) if traced else None) or \
                        self._build_variant(shapes)
                except BaseException as error:
                    with self._variants_lock:
                        del self._pending[key]  # a later call tries again
                    pending.set_exception(error)
                    raise
                with self._variants_lock:
                    self._variants[key] = ready
                    del self._pending[key]
                    self._plans_by_call_key.clear()  # a new block size may serve them better
                pending.set_result(ready)
        self._last = ready
        return ready

    def _traced_variant_for(self, shapes: dict[str, tuple[int, ...]]
                            ) -> tuple[Build, CompiledModel] | None:
        with self._variants_lock:
            variants = list(self._traced)
        for variant in variants:
            try:
                variant.dims_for(shapes)
            except NotTraceable:
                continue
            assert variant.runtime is not None
            return variant.build, variant.runtime
        return None

    def _build_traced_variant(self, shapes: dict[str, tuple[int, ...]]
                              ) -> tuple[Build, CompiledModel] | None:
        """A build for every size of the non-batch dims of ``shapes`` (the batch, when it runs
        in blocks, stays a block size), or None when the module compiles specializations
        (``runtime_dims_reason`` says why)."""
        from ember.package.artifact import pack_artifact
        from ember.runtime.artifact import artifact_from_memory

        if self.runtime_dims_reason or self._all_static():
            return None
        keep: frozenset[str] = frozenset()
        if self.batch_split is not None:
            try:
                keep = frozenset((batch_symbol(self.graph),))
            except NotSeparable:
                pass
        symbols = traced_symbols(self.graph, shapes, keep)
        if not symbols:
            return None
        dims = tuple(symbols.values())
        with self._variants_lock:
            refused = [why for trace, why in self._refused if trace.names == tuple(symbols)
                       and trace.failed_guard(dims) is None]
            if refused:  # sizes of a refused trace's region: it would be refused again
                self.last_refusal = refused[0]
                return None
        reason = self._why_build(shapes, traced=True)
        try:
            variant = build_traced(self.graph, self.options, shapes, symbols)
        except NotTraceable as why:
            self._refuse(why)
            LOG.info("%s: the dims %s are compiled into the code: %s", self.graph.name,
                     ", ".join(symbols), why)
            return None
        packed = pack_artifact(variant.build)
        artifact = artifact_from_memory(packed.manifest, packed.files,
                                        f"<compiled in memory: {self.graph.name}>")
        variant.runtime = runtime_for(variant, artifact, _HostResolver(variant.build))
        with self._variants_lock:
            self.build_reasons.append(reason)
            if self._num_threads is not None:
                variant.runtime.set_num_threads(self._num_threads)
            self._traced.append(variant)
            self._plans_by_call_key.clear()
        LOG.info("%s: compiling once for every size of %s (traced at %s; %d guards): %s",
                 self.graph.name, ", ".join(symbols), variant.describe(variant.trace.samples),
                 len(variant.trace.guards), reason)
        return variant.build, variant.runtime

    def _refuse(self, why: NotTraceable) -> None:
        """Note a refused trace.  One refused for the graph (no trace: e.g. a node that runs
        in the host) or too many refused for a size compiled in turn tracing off for the
        module; sizes in the region of a refused trace are compiled into the code from then
        on."""
        with self._variants_lock:
            self._refusals += not why.pinned
            self.last_refusal = str(why)
            if why.trace is None:
                self.runtime_dims_reason = str(why)
            else:
                self._refused.append((why.trace, str(why)))
                if self._refusals >= MAX_REFUSED_TRACES:
                    self.runtime_dims_reason = (f"{self._refusals} traces were refused, the "
                                                f"last because {why}")

    def _build_variant(self, shapes: dict[str, tuple[int, ...]]) -> tuple[Build, CompiledModel]:
        from ember.package.artifact import pack_artifact
        from ember.runtime.artifact import artifact_from_memory

        if not self._all_static():
            reason = self._why_build(shapes)
            with self._variants_lock:
                self.build_reasons.append(reason)
            LOG.info("%s: compiling a specialization for input shapes %s: %s",
                     self.graph.name, ", ".join(f"{n}{list(s)}" for n, s in shapes.items()),
                     reason)
        build = build_graph(self.graph, shapes, self.options)
        if build.host_nodes and not self.allow_fallbacks:
            raise UnsupportedOpError(
                [(impl.node.op, impl.node.name, f"no compiled kernel ({impl.reason})")
                 for impl in build.host_nodes],
                advice="ember.compile(..., allow_fallbacks=True) runs them as numpy "
                       "references instead; the saved artifact then needs ember.load() (the "
                       "ember package), not the bare runtime.")
        # The module runs the artifact a deployment would load, packed and checked by the
        # same code, only without a round trip of its weights through the disk.
        packed = pack_artifact(build)
        artifact = artifact_from_memory(packed.manifest, packed.files,
                                        f"<compiled in memory: {self.graph.name}>")
        runtime = CompiledModel(artifact, host_resolver=_HostResolver(build))
        with self._variants_lock:
            if self._num_threads is not None:
                runtime.set_num_threads(self._num_threads)
        return build, runtime

    def _why_build(self, shapes: dict[str, tuple[int, ...]], traced: bool = False) -> str:
        """Why ``shapes`` need a build of their own: which symbolic dims take sizes no build
        has, and why they are not served by one (the guard's explanation of a recompile);
        ``traced`` when the build is one for every size of them."""
        sizes_of: dict[str, set[int]] = {}  # symbol -> the sizes compiled so far
        with self._variants_lock:
            compiled = [dict(key) for key in list(self._variants) + list(self._pending)
                        if dict(key) != shapes]
        if not compiled:
            return "the first call"
        new: dict[str, int] = {}
        for name, shape in shapes.items():
            vtype = self.graph.types.get(name)
            if not isinstance(vtype, TensorType) or vtype.shape is None:
                continue
            for axis, dim in enumerate(vtype.shape):
                symbol = single_symbol(dim)
                if symbol is not None:
                    new.setdefault(symbol, shape[axis])
                    sizes_of.setdefault(symbol, set()).update(
                        known[name][axis] for known in compiled if name in known)
        changed = [symbol for symbol, size in new.items()
                   if size not in sizes_of.get(symbol, ())]
        try:
            batch: str | None = batch_symbol(self.graph)
        except NotSeparable:
            batch = None
        why = []
        with self._variants_lock:
            traced_builds = list(self._traced)
        broken = None   # the guard of a traced build these shapes break, if any
        for variant in traced_builds:
            try:
                variant.dims_for(shapes)
            except GuardFailed as failure:
                broken = failure
                break
            except NotTraceable:
                continue    # a build for another batch block size
        if broken is not None:
            why.append(f"the build for every size does not serve them: {broken}")
        if any(symbol != batch for symbol in changed) and traced:
            why.append("one build for every size of " +
                       ", ".join(symbol for symbol in changed if symbol != batch))
        elif any(symbol != batch for symbol in changed):
            # why they are not taken at run time, when the module tries to
            refusal = (self.runtime_dims_reason or self.last_refusal) \
                if runtime_dims_enabled() else ""
            why.append("sizes other than the batch are compiled into the code" +
                       (f" ({refusal})" if refusal else ""))
        if batch in changed:
            why.append("a block size the batch runs in" if self.batch_split is not None else
                       f"the batch does not run in blocks: {self.batch_split_reason}")
        what = ", ".join(f"{symbol}={new[symbol]} (compiled for "
                         f"{', '.join(map(str, sorted(sizes_of[symbol])))})"
                         for symbol in changed) or "a combination of compiled sizes"
        return "; ".join([f"new {what}", *why])

    # ------------------------------------------------------------------ running
    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    def run(self, feeds: Any, *, out: Any = None) -> dict[str, np.ndarray]:
        """Run on a dict name -> array (or a list/tuple in input order); outputs by name.
        ``out``: arrays to write the outputs into, as for :meth:`__call__`."""
        return self._run(bind_run(self.input_names, feeds),
                         bind_outputs(self.graph.outputs, out))

    def __call__(self, /, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        """Run on positional and/or named arrays: the output array of a one-output model,
        else a tuple of arrays in output order.

        ``out`` (optional) takes the outputs instead of new arrays: an array (one-output
        model), a list/tuple in output order (None where a new array will do) or a dict
        output name -> array, each a writable, C-contiguous array of the output's exact
        dtype and shape for this call (else an InputError naming the output).  The results
        are written into them and the same arrays returned (as ``CompiledModel.__call__``
        does; a model with an input named ``out`` takes it as that input).
        """
        if out is not None and "out" in self.graph.inputs:
            kwargs["out"], out = out, None
        targets = bind_outputs(self.graph.outputs, out)
        if not kwargs:  # arrays of dtypes and shapes seen before: straight to their runtime
            runtime = self._known_runtime(args)
            if runtime is not None:
                outputs = runtime._execute(args, targets)
                return outputs[0] if len(outputs) == 1 else tuple(outputs)
        return call_result(self.output_names,
                           self._run(bind_call(self.input_names, args, kwargs), targets))

    def _known_runtime(self, args: tuple) -> CompiledModel | None:
        """The runtime of the variant that ran inputs of these dtypes and shapes, all given
        positionally as plain arrays, before (None otherwise); it is now the current one."""
        names = self.graph.inputs
        if len(args) != len(names):
            return None
        key = []
        for value in args:
            if type(value) is not np.ndarray:
                return None
            key.append((value.dtype, value.shape))
        key = tuple(key)
        last = self._last_call  # (key, variant, shapes) of the last call served here
        if last is None or last[0] != key:
            known = self._by_call_key.get(key)
            if known is None or known[1]._output_names != tuple(self.graph.outputs):
                return None
            last = self._last_call = (key, known, dict(zip(names, (s for _, s in key))))
        self._last, self._last_shapes = last[1], last[2]
        return last[1][1]

    def _run(self, feeds: Mapping[str, Any], out: Sequence[Any] | None = None
             ) -> dict[str, np.ndarray]:
        """Run on inputs bound by name; ``out``: caller-given arrays, one entry per output
        in output order (None: a new array), from :func:`bind_outputs`."""
        arrays, plan = self._bind(feeds, blocks=True)
        given = {} if out is None else \
            {name: array for name, array in zip(self.graph.outputs, out) if array is not None}
        if isinstance(plan, tuple):
            # bound and checked above
            return plan[1]._run(arrays, given) if given else plan[1]._run(arrays)
        axes = dict(plan.split.output_axes)
        checked = given and check_block_outputs(
            given, plan.blocks[0][1][1].outputs, plan.blocks[0][0],
            sum(size for size, _ in plan.blocks), plan.split.batch_outputs, axes)
        result = run_in_blocks(arrays, plan.split.inputs, plan.split.batch_outputs,
                               [(size, variant[1]._run) for size, variant in plan.blocks],
                               checked, axes)
        result.update(given)  # the caller's very arrays
        return result

    def _bind(self, feeds: Mapping[str, Any], blocks: bool = False, traced: bool = True
              ) -> tuple[dict[str, np.ndarray], Any]:
        """The checked input arrays, and the variant compiled for their shapes; with
        ``blocks``, a batch the compiled blocks serve gives instead the :class:`_BlockPlan`
        that covers it (see :meth:`_block_plan`)."""
        from ember.interp.reference import check_inputs

        # Arrays of dtypes and shapes seen before go straight to their variant, whose runtime
        # checks dtype and shape exactly: the per-call cost of a small model is this path.
        call_key = self._call_key(feeds)
        known = self._by_call_key.get(call_key) if call_key is not None and traced else None
        if known is not None:
            self._last = known
            self._last_shapes = {name: feeds[name].shape for name in self.graph.inputs}
            return dict(feeds), known
        planned = self._plans_by_call_key.get(call_key) \
            if blocks and call_key is not None and traced else None
        if planned is not None:
            plan, self._last, self._last_shapes = planned
            return dict(feeds), plan  # (each block's runtime checks its slice exactly)

        arrays = {name: value if type(value) is np.ndarray else
                  as_array(name, value, _describe(self.graph.types.get(name)))
                  for name, value in feeds.items()}
        check_inputs(self.graph, arrays)  # dtype, rank, static dims: before compiling
        shapes = self._shapes_from({name: tuple(array.shape) for name, array in arrays.items()})
        split = self._split_for(shapes) if blocks else None
        if split is not None:
            plan = self._block_plan(shapes, split)
            if plan is not None:
                if call_key is not None and traced:
                    with self._variants_lock:
                        self._plans_by_call_key[call_key] = (plan, self._last,
                                                             self._last_shapes)
                return arrays, plan
        variant = self._variant(shapes, traced)
        if call_key is not None and traced:
            with self._variants_lock:
                self._by_call_key[call_key] = variant
        return arrays, variant

    def _block_plan(self, shapes: dict[str, tuple[int, ...]], split: BatchSplit
                    ) -> _BlockPlan | None:
        """The blocks (size, variant) that serve this batch, in order; None when it runs as
        one specialization: the first batch size seen, the first above 1 when that was 1
        (so that large batches do not run one sample at a time), one already compiled, or
        0."""
        batch = shapes[split.inputs[0]][0]
        if batch == 0 or any(shapes[name][0] != batch for name in split.inputs):
            return None  # inputs that disagree on the batch: the compiler reports it
        others = self._other_dims(shapes, split)
        with self._variants_lock:
            known = set(self._block_sizes.get(others, ()))
            if batch in known or not known or known == {1}:
                self._note_block_sizes(shapes, split, {batch})
                return None
        order = plan_blocks(batch, known)
        if order is None:
            LOG.info("%s: compiling a batch-1 block, so that every batch size runs "
                     "on the compiled blocks %s and 1", self.graph.name, sorted(known))
            order = plan_blocks(batch, known | {1})
            assert order is not None
        variants = {size: self._variant(_with_batch(shapes, size, split))
                    for size in set(order)}
        with self._variants_lock:
            self._note_block_sizes(shapes, split, set(variants))
        return _BlockPlan(split, [(size, variants[size]) for size in order])

    def _note_block_sizes(self, shapes: dict[str, tuple[int, ...]], split: BatchSplit,
                          sizes: set[int]) -> None:
        """Record block sizes compiled for these non-batch dims, under their symbols and
        their sizes: a module that stops tracing (a refused trace) still finds them.  The
        caller holds the variants lock."""
        for traced in (True, False):
            self._block_sizes.setdefault(self._other_dims(shapes, split, traced),
                                         set()).update(sizes)

    def _other_dims(self, shapes: dict[str, tuple[int, ...]], split: BatchSplit,
                    traced: bool | None = None) -> tuple:
        """The key of a call's non-batch dims, under which the block sizes compiled for them
        are kept: their sizes, or their symbols while the module compiles one build for every
        size of them (the blocks then serve every size)."""
        if traced is None:
            traced = not self.runtime_dims_reason
        key = []
        for name, shape in sorted(shapes.items()):
            vtype = self.graph.types.get(name)
            dims = vtype.shape if isinstance(vtype, TensorType) and vtype.shape is not None \
                else (None,) * len(shape)
            entry = tuple(single_symbol(dim) or size if traced else size
                          for dim, size in zip(dims, shape))
            key.append((name, entry[1:] if name in split.inputs else entry))
        return tuple(key)

    def _call_key(self, feeds: Mapping[str, Any]) -> tuple | None:
        """(dtype, shape) of every input when all are plain arrays of the graph's inputs (the
        key of the fast path), else None."""
        key = []
        for name in self.graph.inputs:
            value = feeds.get(name)
            if type(value) is not np.ndarray:
                return None
            key.append((value.dtype, value.shape))
        return tuple(key) if len(feeds) == len(key) else None

    def profile(self, feeds: Any, *, repeat: int = 10, warmup: int = 2,
                peak: Peak | None = None) -> Profile:
        """Time every kernel (and fallback node) of a run on ``feeds`` (as for :meth:`run`).

        The library runs ``warmup`` untimed rounds, then ``repeat`` rounds that each time a
        whole call and every step of a profiled call (the same steps, with a clock read
        between them); the result has the per-step medians joined with what the build knows
        of each step: its nodes, FLOPs and bytes moved.  ``peak`` (``ember.profile.
        measure_peak()``, measured in the same run) adds each step's share of the FMA peak
        and of the memory bandwidth.
        """
        from ember.profile import build_profile
        from ember.runtime.profiling import check_counts

        check_counts(repeat, warmup)
        # a specialization: the per-step report describes one set of shapes
        arrays, (build, runtime) = self._bind(bind_run(self.input_names, feeds), traced=False)
        times = runtime.profile(arrays, repeat=repeat, warmup=warmup)
        with self._variants_lock:
            threads = self._num_threads
        return build_profile(build.graph, build.impls, times.step_seconds, times.call_seconds,
                             repeat=repeat, warmup=warmup, threads=threads, peak=peak,
                             model=self.graph.name,
                             inputs={name: array.shape for name, array in arrays.items()})

    def set_num_threads(self, count: int | None) -> None:
        """Threads the compiled kernels run on, the calling thread included (None or 0: the
        CPUs this process may use), for every variant compiled so far and later."""
        count = check_thread_count(count, allow_zero=True) or None
        with self._variants_lock:
            self._num_threads = count
            runtimes = [runtime for _, runtime in self._variants.values()]
        for runtime in runtimes:
            runtime.set_num_threads(count)

    # ------------------------------------------------------------------ reporting
    @property
    def build(self) -> Build:
        if self._last is None:
            raise InputError("this module has dynamic input shapes and was not called yet; "
                             "call it once or compile with input_shapes=...")
        return self._last[0]

    def report(self) -> str:
        return self.build.report()

    def save(self, path: str | Path, *,
             batch_blocks: bool | Sequence[int] | None = None,
             input_shapes: Mapping[str, Sequence[int]] | None = None) -> Path:
        """Write the artifact of the current specialization to directory ``path``.

        A module that runs its batch in blocks (:attr:`batch_split`) saves instead every block
        size compiled for the current sizes of its other dims, and a block of 1 sample
        (compiled now if it was not yet): the artifact then runs any batch size, as this
        module does (``ember.runtime.BatchBlockedModel``).  ``batch_blocks=False`` saves the
        current specialization alone; ``True`` insists on blocks and says why it cannot; a
        list of sizes insists too and compiles those blocks as well -- a server that batches
        requests of any number wants several (``[16, 8, 4, 2, 1]`` runs every batch up to 31
        in at most five calls, where blocks of 16 and 1 run a batch of 15 as 15 calls).

        An artifact holds code for one size of every dim other than the batch (builds that
        take a sequence length at run time cannot be saved: their guards and size formulas
        live in the compiler).  A module that ran at several such sizes is refused with an
        :class:`InputError` listing them, rather than saved with all but the last silently
        dropped; ``input_shapes`` (name -> shape, as for ``ember.compile``) says which to
        save, one artifact per call.
        """
        if input_shapes is not None:
            return self._save_shapes(path, input_shapes, batch_blocks)
        self.build  # noqa: B018 -- a module never called has nothing to save: say so
        self._check_nothing_dropped()
        return self._save_current(path, batch_blocks)

    def _save_current(self, path: str | Path, batch_blocks: bool | Sequence[int] | None
                      ) -> Path:
        """Save the current specialization (or its batch blocks)."""
        from ember.package.artifact import save_artifact, save_batch_blocks

        extra_sizes = _block_sizes_asked(batch_blocks)

        build = self.build
        if isinstance(self._last[1], RuntimeDimsModel) and self._last_shapes is not None:
            # an artifact holds specializations (its runtime takes no run-time dims)
            last = self._last
            build = self._variant(self._last_shapes, traced=False)[0]
            self._last = last
        plan = self._saved_blocks(extra_sizes) if batch_blocks is not False else None
        if plan is None:
            if batch_blocks:
                raise InputError(f"model '{self.graph.name}' cannot be saved in batch blocks: "
                                 f"{self.batch_split_reason or 'its inputs have no dynamic batch'}")
            _warn_of_fallbacks(build, path)
            return save_artifact(build, path)
        split, builds = plan
        _warn_of_fallbacks(build, path)
        return save_batch_blocks(builds, split.inputs, split.batch_outputs, path,
                                 split.output_axes)

    def export(self, directory: str | Path, *, target: str | Target = "host",
               input_shapes: Mapping[str, Sequence[int]] | None = None,
               name: str | None = None, dynamic_dims: Sequence[str] = (),
               embed_weights: bool = False) -> "ExportResult":
        """Compile this model for ``target`` and write a directory that runs it without Python
        (see :func:`ember.export`, which explains ``dynamic_dims`` and ``embed_weights``), for
        ``input_shapes`` or else the shapes of the current specialization.  Schedules tuned
        for this machine are kept for the same target only."""
        from dataclasses import replace

        from ember.package.export import export_build, is_browser_target, parse_export_target

        resolved = parse_export_target(target)
        if input_shapes is not None:
            shapes = self._shapes_from(input_shapes)
            missing = [n for n in self.graph.inputs if n not in shapes]
            if missing:
                raise InputError(f"export(input_shapes=...) of model '{self.graph.name}' needs "
                                 f"the shape of every dynamic input; none for {missing}")
        elif self._last_shapes is not None:
            shapes = dict(self._last_shapes)
        else:
            raise InputError("this module has dynamic input shapes and was not called yet; "
                             "give export(input_shapes=...)")
        options = self.options if resolved == self.options.target else replace(
            self.options, target=resolved, tuned_configs={}, config_chooser=None)
        name = name if name is not None else self.graph.name
        if dynamic_dims:
            build, dims = _traced_for_export(self.graph, options, shapes, dynamic_dims)
        else:
            build, dims = build_graph(self.graph, shapes, options), None
        return export_build(build, directory, name, browser=is_browser_target(target),
                            dims=dims, embed_weights=embed_weights)

    def _save_shapes(self, path: str | Path, input_shapes: Mapping[str, Sequence[int]],
                     batch_blocks: bool | None) -> Path:
        """``save`` of the specialization for ``input_shapes`` (compiled if needed); the
        module's current specialization stays current."""
        unknown = [name for name in input_shapes if name not in self.graph.inputs]
        shapes = self._shapes_from(input_shapes)
        missing = [name for name in self.graph.inputs if name not in shapes]
        if missing or unknown:
            problems = [*(f"no shape for '{n}'" for n in missing),
                        *(f"'{n}' is not an input" for n in unknown)]
            raise InputError(f"save(input_shapes=...) of model '{self.graph.name}' needs the "
                             f"shape of every dynamic input: {'; '.join(problems)} (its "
                             f"inputs: {', '.join(self.graph.inputs)})")
        last, last_shapes = self._last, self._last_shapes
        try:
            self._variant(shapes, traced=False)
            return self._save_current(path, batch_blocks)
        finally:
            if last is not None:
                self._last, self._last_shapes = last, last_shapes

    def _check_nothing_dropped(self) -> None:
        """Refuse to save when the module ran at sizes the artifact would not serve.

        The artifact serves the current sizes of every dim other than the batch and, when
        the batch runs in blocks, every batch size (with ``batch_blocks=False`` the caller
        chose one batch size explicitly): a module whose batch does not run in blocks
        compares whole input shapes, one that does only the other dims."""
        current = self._last_shapes
        if current is None or self._all_static():
            return
        split = self._split_for(current) if self.batch_split is not None or \
            self._split_at_sizes else None

        def served_as(shapes: dict[str, tuple[int, ...]]) -> tuple:
            if split is not None and all(name in shapes for name in split.inputs):
                return self._other_dims(shapes, split, traced=False)
            return tuple(sorted(shapes.items()))

        saved = served_as(current)
        with self._variants_lock:
            seen = list(self._shapes_seen.values())
        dropped: dict[tuple, dict[str, tuple[int, ...]]] = {}
        for shapes in seen:
            key = served_as(shapes)
            if key != saved:
                dropped.setdefault(key, shapes)
        if not dropped:
            return

        def spell(shapes: dict[str, tuple[int, ...]]) -> str:
            return ", ".join(f"{name}{list(shape)}" for name, shape in shapes.items())

        listed = [spell(shapes) for shapes in list(dropped.values())[:8]]
        if len(dropped) > 8:
            listed.append(f"... and {len(dropped) - 8} more")
        what = "sizes of the dims other than the batch" if split is not None else \
            "input shapes"
        raise InputError(
            f"model '{self.graph.name}' ran at {len(dropped) + 1} {what}, but an artifact "
            f"holds compiled code for one of them: saving would keep only the last call's "
            f"({spell(current)}) and drop {'; '.join(listed)}. Save one artifact per shape "
            f"you need, e.g. module.save(path, input_shapes={dict(current)!r})")

    def _saved_blocks(self, extra_sizes: frozenset[int] = frozenset()
                      ) -> tuple[BatchSplit, dict[int, Build]] | None:
        """The split and the build of every block size to save for the current sizes of the
        non-batch dims (a block of 1 and ``extra_sizes`` compiled if missing); None when the
        batch is not split."""
        if self._all_static() or self._last is None:
            return None
        last = self._last
        shapes = self._last_shapes
        assert shapes is not None
        split = self._split_for(shapes)
        if split is None:
            return None
        others = self._other_dims(shapes, split)
        with self._variants_lock:
            sizes = set(self._block_sizes.get(others, ())) | {shapes[split.inputs[0]][0], 1}
            sizes |= extra_sizes
        sizes.discard(0)
        if 1 not in self._block_sizes.get(others, ()):
            LOG.info("%s: compiling a batch-1 block, so that the saved model runs every "
                     "batch size", self.graph.name)
        builds = {size: self._variant(_with_batch(shapes, size, split), traced=False)[0]
                  for size in sizes}
        with self._variants_lock:
            self._note_block_sizes(shapes, split, set(builds))
        self._last = last  # saving compiles blocks; the current specialization stays current
        return split, builds


def _block_sizes_asked(batch_blocks: bool | Sequence[int] | None) -> frozenset[int]:
    """The block sizes a ``save(batch_blocks=[...])`` asks for, checked (none for a bool)."""
    if batch_blocks is None or isinstance(batch_blocks, bool):
        return frozenset()
    sizes = list(batch_blocks)
    if not sizes or not all(isinstance(size, (int, np.integer)) and
                            not isinstance(size, bool) and 1 <= size <= MAX_BLOCK_SIZE
                            for size in sizes):
        raise InputError(f"batch_blocks={batch_blocks!r}: give True, False or a list of block "
                         f"sizes, integers from 1 to {MAX_BLOCK_SIZE}")
    if len(set(sizes) | {1}) > MAX_BLOCKS:
        raise InputError(f"batch_blocks lists {len(set(sizes))} sizes; an artifact holds at "
                         f"most {MAX_BLOCKS} blocks")
    return frozenset(int(size) for size in sizes)


@dataclass(frozen=True)
class _BlockPlan:
    """A call served in blocks: how the graph splits, and (block size, variant) in order."""

    split: BatchSplit
    blocks: list[tuple[int, tuple[Build, CompiledModel]]]


def _with_batch(shapes: dict[str, tuple[int, ...]], size: int,
                split: BatchSplit) -> dict[str, tuple[int, ...]]:
    """``shapes`` with the batch inputs' first dim set to ``size``."""
    return {name: ((size,) + shape[1:] if name in split.inputs else shape)
            for name, shape in shapes.items()}


def _describe(vtype: Any) -> str:
    """A value type as the runtime spells buffers (``float32[2, 3]``), for messages."""
    if isinstance(vtype, TensorType) and vtype.shape is not None:
        return f"{vtype.dtype.numpy.name}[{', '.join(str(d) for d in vtype.shape)}]"
    return str(vtype)


class _HostResolver:
    """Builds the Python side of fallback nodes from the build that declared them."""

    def __init__(self, build: Build):
        self._impls = {impl.index: impl for impl in build.host_nodes}
        self._graph = build.graph

    def __call__(self, entry: HostNodeEntry) -> HostFunction:
        return host_function(self._impls[entry.index].node, self._graph)


def host_function(node, graph: Graph):
    """A function running ``node``'s numpy reference on a list of input arrays: its explicit
    inputs, then the values its subgraphs read from the enclosing graph (in
    ``node.implicit_inputs()`` order)."""
    from ember.interp.reference import NodeInterpreter

    interpreter = NodeInterpreter()
    implicit = node.implicit_inputs()
    explicit_count = sum(1 for name in node.inputs if name)

    def run(inputs: list[np.ndarray]) -> list[np.ndarray]:
        it = iter(inputs[:explicit_count])
        args = [next(it) if name else None for name in node.inputs]
        scope = dict(zip(implicit, inputs[explicit_count:]))
        outputs = interpreter.run_node(graph, node, args, scope)
        return [o for o, name in zip(outputs, node.outputs) if name]

    return run


def _resolve_from_manifest(entry: HostNodeEntry) -> HostFunction:
    """Rebuild a fallback node from its host_nodes.json entry: a one-node graph whose node
    must be the op the manifest names, reading and writing the buffers the manifest lists
    (which the runtime checked against the library's signature).  Anything else in the file
    is a ModelLoadError: its content is as untrusted as the rest of the artifact."""
    from ember.ir.serialize import graph_from_json
    from ember.ir.verifier import verify
    from ember.ops.registry import get_op

    where = f"host_nodes.json, node {entry.index} ({entry.op!r})"
    detail = entry.detail
    if not isinstance(detail, Mapping) or set(detail) != {"node"}:
        raise ModelLoadError(f"{where}: the entry must be an object with one field 'node'")
    try:
        graph = graph_from_json(detail["node"])
        verify(graph, get_op)
    except ModelLoadError as error:
        raise ModelLoadError(f"{where}: {error}") from None
    except RecursionError:
        raise ModelLoadError(f"{where}: the node graph is nested too deeply") from None
    except Exception as error:  # noqa: BLE001 -- whatever the decoder trips over
        raise ModelLoadError(f"{where}: not a valid node graph ({type(error).__name__}: "
                             f"{error})") from None
    if len(graph.nodes) != 1:
        raise ModelLoadError(f"{where}: holds {len(graph.nodes)} nodes, expected one")
    node = graph.nodes[0]
    if node.op != entry.op:
        raise ModelLoadError(f"{where}: the node is a {node.op!r}, the manifest says "
                             f"{entry.op!r}")
    reads = [n for n in node.inputs if n] + node.implicit_inputs()
    writes = [n for n in node.outputs if n]
    _check_buffers(where, "inputs", reads, entry.inputs, graph)
    _check_buffers(where, "outputs", writes, entry.outputs, graph)
    if tuple(node.implicit_inputs()) != entry.implicit_inputs:
        raise ModelLoadError(f"{where}: the node's subgraphs read {node.implicit_inputs()}, "
                             f"the manifest says {list(entry.implicit_inputs)}")
    return host_function(node, graph)


def _check_buffers(where: str, kind: str, names: list[str], specs: Sequence[Any],
                   graph: Graph) -> None:
    """The node's values must be the buffers the manifest (and so the library) has."""
    if len(names) != len(specs):
        raise ModelLoadError(f"{where}: the node has {len(names)} {kind}, the manifest lists "
                             f"{len(specs)}")
    for name, spec in zip(names, specs):
        vtype = graph.types.get(name)
        if not isinstance(vtype, TensorType) or not vtype.is_static or \
                vtype.dtype.numpy.name != spec.dtype or \
                tuple(int(d) for d in vtype.shape) != spec.shape:
            raise ModelLoadError(f"{where}: value {name!r} is {vtype}, the manifest's buffer "
                                 f"is {spec.describe()}")


def _warn_of_fallbacks(build: Build, path: str | Path) -> None:
    """Say at save time, not when a deployment loads it, that an artifact needs ember."""
    if build.host_nodes:
        ops = sorted({impl.node.op for impl in build.host_nodes})
        LOG.warning("the artifact '%s' runs %d node(s) as numpy references (%s): "
                    "ember.runtime.load() will refuse it; it loads with ember.load(), which "
                    "needs the ember package", path, len(build.host_nodes), ", ".join(ops))


def compile(model: Any, example_inputs: Any = None, *, target: str | Target = "native",
            opt_level: int = 2, input_shapes: Mapping[str, Sequence[int]] | None = None,
            sanitize: bool = False, memory_limit: int | str | None = None,
            dynamic_shapes: Any = None, dynamic_batch: bool | None = None,
            threads: int | None = None, base_dir: str | Path | None = None,
            kernel_configs: Mapping[str, Any] | None = None,
            tuning_db: str | Path | None = None, schedule: str = "default",
            allow_fallbacks: bool | None = None) -> Module:
    """Compile an ONNX model (path, bytes, ModelProto), a ``torch.nn.Module`` or an ember
    Graph to native code.

    A torch module is exported with ``torch.export`` on ``example_inputs`` (a tensor or a
    tuple of them), in evaluation mode and without autograd; its parameters and buffers
    become the artifact's weights.  ``dynamic_shapes`` (as for ``torch.export.export``) keeps
    sizes symbolic: the module then compiles a specialization per input shape on first use.
    ``input_shapes`` fixes the shapes of dynamic inputs (otherwise the first call does);
    ``sanitize=True`` builds with AddressSanitizer and UBSan (for tests: the process must
    preload the sanitizer runtime, see ``ember.toolchain.compiler.sanitizer_preload``).
    ``dynamic_batch`` (default: on, unless ``EMBER_DYNAMIC_BATCH=0``) serves every batch size
    of a model whose samples are computed apart from the blocks already compiled, instead
    of compiling a specialization per batch size (see the module docstring).
    ``memory_limit`` (bytes, or a string like ``"8GiB"``) is the most memory compiling and
    running may need; default: ``$EMBER_MEMORY_LIMIT``, else the memory available (see
    ``ember.core.config``).  A model that needs more is refused with a MemoryBudgetError.
    ``threads`` is how many threads the compiled kernels run on, the calling thread included
    (default: the CPUs this process may use); it is a run-time setting, not compiled in
    (``module.set_num_threads`` changes it, and a saved artifact takes its own at load).
    ``base_dir`` is the directory an ONNX model's external tensor data is read from: by
    default the model file's own directory; a model given as bytes or a ModelProto with
    external tensors needs it (nothing is ever read relative to the working directory).
    ``kernel_configs`` maps workload keys (``ember.schedule.workload``) to schedule configs
    (``ember.schedule.config.KernelConfig``, or a mapping of knob names to values): a kernel
    whose key is listed is scheduled with that config, every other one with the default
    heuristic.
    ``tuning_db`` is a tuning database written by ``ember tune`` / ``ember.tune``: every kernel
    with a record measured on this machine and target takes the config the tuner decided on
    (else the best recorded, by median time; ``module.report()`` says how many did, a saved
    artifact lists them); a record this ember's kernel no longer accepts is skipped with a
    warning.  Records of other machines are never applied.
    ``schedule="predicted"`` lets the tuner's shipped cost model pick the config of every
    kernel nothing else configures, measuring nothing (``ember.tune.predict``; needs
    ``ember[tune]``); ``"default"`` leaves them to the heuristic.
    ``allow_fallbacks`` says whether nodes that have no compiled kernel may run as ember's
    numpy references (an artifact with such nodes loads with ``ember.load``, not with the
    bare ``ember.runtime.load``); when not, the first build raises an UnsupportedOpError
    listing every such node.  Default: refused for a torch module (the AOT route promises
    artifacts that run without ember), allowed for ONNX models.
    """
    threads = check_thread_count(threads)
    if memory_limit is not None:
        memory_limit = parse_size(memory_limit)  # a typo fails now, not at the first call
    graph = import_model(model, memory_limit, example_inputs, dynamic_shapes, base_dir)
    resolved = target if isinstance(target, Target) else Target.parse(target)
    options = BuildOptions(target=resolved, opt_level=opt_level, sanitize=sanitize,
                           memory_limit=memory_limit,
                           kernel_configs=_kernel_configs(kernel_configs),
                           tuned_configs=tuned_configs_from(tuning_db, resolved),
                           config_chooser=config_chooser_for(schedule, resolved, opt_level))
    if allow_fallbacks is None:
        allow_fallbacks = not is_torch_module(model)
    module = Module(graph, options, input_shapes, dynamic_batch=dynamic_batch,
                    allow_fallbacks=allow_fallbacks)
    if threads is not None:
        module.set_num_threads(threads)
    return module


def export(model: Any, directory: str | Path, *, target: str | Target = "host",
           input_shapes: Mapping[str, Sequence[int]] | None = None, name: str | None = None,
           dynamic_dims: Sequence[str] = (), embed_weights: bool = False,
           example_inputs: Any = None, opt_level: int = 2,
           memory_limit: int | str | None = None,
           base_dir: str | Path | None = None) -> "ExportResult":
    """Compile ``model`` for ``target`` and write a directory that runs it without Python:
    a C header and a shared and a static library (Linux targets), or a WebAssembly module
    (``wasm32-wasi``), with the weights file they load (see ``ember.package.export``).

    ``target``: ``host`` (this machine), ``x86_64-linux`` (any x86-64),
    ``x86_64-avx2-linux``, ``x86_64-avx512-linux``, ``aarch64-linux``, ``wasm32-wasi``,
    ``wasm32-browser`` (the module with a JavaScript loader and a page), or any name
    ``ember.Target.parse`` takes.  The export is built for fixed shapes: every dynamic
    dim must be given by ``input_shapes`` (or by ``example_inputs`` for a torch module).
    ``name`` (default: the model's) names the files and prefixes the C functions.  A model
    with nodes that only ember's numpy references run is refused, naming them.
    ``dynamic_dims`` names symbolic input dims (``"seq"``) that the export takes at run time
    instead (``<name>_set_dims`` in C): the model is traced at the sizes ``input_shapes``
    gives them, and the export serves every size its guards admit (``export.json`` and the
    README say which: for a sequence length, a range such as 16..31).
    ``embed_weights`` links the weights into the libraries (``<name>_create_embedded``; Linux
    targets) instead of writing them beside as ``<name>.weights``.
    """
    from ember.package.export import export_build, is_browser_target, parse_export_target

    resolved = parse_export_target(target)
    graph = import_model(model, memory_limit, example_inputs, None, base_dir)
    options = BuildOptions(target=resolved, opt_level=opt_level, memory_limit=memory_limit)
    name = name if name is not None else graph.name
    browser = is_browser_target(target)
    if not dynamic_dims:
        return export_build(build_graph(graph, input_shapes, options), directory, name,
                            browser=browser, embed_weights=embed_weights)
    build, dims = _traced_for_export(graph, options, input_shapes, dynamic_dims)
    return export_build(build, directory, name, browser=browser, dims=dims,
                        embed_weights=embed_weights)


def _traced_for_export(graph: Graph, options: BuildOptions,
                       input_shapes: Mapping[str, Sequence[int]] | None,
                       dynamic_dims: Sequence[str]) -> "tuple[Build, DimsSpec]":
    """A build traced over ``dynamic_dims`` at the sizes ``input_shapes`` gives them, and the
    C API's description of its dims."""
    from ember.dynamic_dims import covered_sizes
    from ember.package.c_api import DimsSpec

    shapes = {name: tuple(int(d) for d in shape) for name, shape in (input_shapes or {}).items()}
    missing = [n for n in graph.inputs if n not in shapes and not graph.types[n].is_static]
    if missing:
        raise InputError(f"export(dynamic_dims=...) traces the model at the sizes input_shapes "
                         f"gives: no shape for {missing}")
    sizes = {}
    for name in graph.inputs:
        vtype = graph.types[name]
        for dim, size in zip(vtype.shape, shapes.get(name, vtype.shape)):
            symbol = single_symbol(dim)
            if symbol is not None:
                sizes.setdefault(symbol, int(size))
    unknown = [d for d in dynamic_dims if d not in sizes]
    if unknown:
        raise InputError(f"dynamic_dims {unknown} are not symbolic dims of the inputs "
                         f"(they have {sorted(sizes)})")
    fixed = {n: shapes.get(n, graph.types[n].shape) for n in graph.inputs}
    try:
        variant = build_traced(graph, options, fixed, {d: sizes[d] for d in dynamic_dims})
    except NotTraceable as why:
        raise InputError(f"cannot export {list(dynamic_dims)} as run-time dims: {why}") from None
    trace = variant.trace
    return variant.build, DimsSpec(
        trace.names, trace.samples, tuple(trace.guards),
        tuple(variant.inputs[n] for n in graph.inputs), variant.outputs, variant.workspace,
        tuple(covered_sizes(trace, trace.samples, i) for i in range(len(trace.names))))


def config_chooser_for(schedule: str, target: Target, opt_level: int
                       ) -> "Callable[..., KernelConfig | None] | None":
    """``BuildOptions.config_chooser`` for ``compile``'s ``schedule`` argument."""
    if schedule == "default":
        return None
    if schedule == "predicted":
        from ember.tune.predict import PredictedSchedules

        return PredictedSchedules(target, opt_level)
    raise InputError(f"schedule={schedule!r}: expected 'default' or 'predicted'")


def tuned_configs_from(path: str | Path | None, target: Target) -> dict[str, KernelConfig]:
    """The config of every workload a tuning database holds for ``target`` on this machine
    (``TuningDatabase.best_configs``; a missing file is an error: a typo must not silently
    mean "untuned")."""
    if path is None:
        return {}
    from ember.tune.database import TuningDatabase, TuningDatabaseError, target_key

    if not Path(path).is_file():
        raise TuningDatabaseError(f"tuning database {path} does not exist; run `ember tune` "
                                  f"to make one, or leave tuning_db out")
    with TuningDatabase(path) as database:
        return database.best_configs(target_key(target))


def _kernel_configs(given: Mapping[str, Any] | None) -> dict[str, KernelConfig]:
    """``compile``'s ``kernel_configs`` as KernelConfigs (a plain mapping of knob values is
    accepted; a value that is neither is refused here, not in the middle of a build)."""
    configs: dict[str, KernelConfig] = {}
    for key, config in (given or {}).items():
        if isinstance(config, KernelConfig):
            configs[str(key)] = config
        elif isinstance(config, Mapping):
            configs[str(key)] = KernelConfig.of(config)
        else:
            raise ScheduleConfigError(
                f"kernel_configs['{key}'] must be a KernelConfig or a mapping of knob names to "
                f"values, got {type(config).__name__}")
    return configs


def load(path: str | Path, *, expected_digest: str | None = None,
         threads: int | None = None) -> CompiledModel | BatchBlockedModel:
    """Load an artifact, with ember's numpy references available for fallback nodes: a
    model for one set of input shapes, or one saved to run any batch size in blocks.

    ``expected_digest`` (the ``digest`` of a model loaded earlier) refuses any other
    artifact; without it, loading runs the artifact's library, so load only artifacts from a
    source you trust.  ``threads``: as for :func:`ember.runtime.load`.
    """
    return load_artifact(path, host_resolver=_resolve_from_manifest,
                         expected_digest=expected_digest, threads=threads)
