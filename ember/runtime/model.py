"""Run a compiled artifact: bind inputs and outputs, own the workspace, call ``ember_run``.

The library's entry point is

    int32_t ember_run(void *const *inputs, void *const *outputs, const uint8_t *weights,
                      uint8_t *workspace, ember_host_fn host, void *host_ctx);

with every buffer 64-byte aligned and sized from the manifest, which the loader has checked
against the library's own signature.  ``ember_run_profiled`` takes the same arguments and a
``double *step_seconds`` of one slot per step (``steps`` in the signature): ``profile()``
times every step with it (:mod:`ember.runtime.profiling`); libraries built before it existed
run as ever but cannot be profiled.  ``host`` is called for nodes that run their numpy
reference instead of compiled code (fallbacks, listed in the manifest); the runtime forwards
those calls to a Python callable given at load time, since only the compiler knows the op
references.  A non-zero return is ``node_index * 256 + code``: a fallback node failed (its
error is re-raised as is) or an index input was out of range (an ExecutionError naming the
node, its op, the input and the valid range).
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ember.runtime.artifact import LIBRARY_FILE, WEIGHTS_FILE, Artifact, read_artifact
from ember.runtime.binding import (as_array, bind_call, bind_outputs, bind_run, check_array,
                                   check_output)
from ember.runtime.dtypes import numpy_dtype
from ember.runtime.errors import EmberError, ExecutionError, InputError, ModelLoadError
from ember.runtime.library import load_library
from ember.runtime.manifest import HostNodeEntry, IndexCheck, Manifest, TensorSpec
from ember.runtime.profiling import StepTimes, check_counts, measure_steps
from ember.runtime.safetensors_io import parse_safetensors
from ember.runtime.signature import (STATUS_EXCLUDED_VALUE, STATUS_HOST_FAILED,
                                     STATUS_INDEX_OUT_OF_RANGE, MAX_SIGNATURE_BYTES,
                                     check_manifest, parse_signature)

ALIGNMENT = 64
HOST_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32,
                           ctypes.POINTER(ctypes.c_void_p))

HostFunction = Callable[[list[np.ndarray]], list[np.ndarray]]
# A host resolver turns a host-node entry of the manifest (with its host_nodes.json detail)
# into a function from input arrays to output arrays.  ember.load() provides one built on the
# op registry.
HostResolver = Callable[[HostNodeEntry], HostFunction]


# The address of a writable, C-contiguous, non-empty array's data, through the buffer protocol:
# a quarter of what ``array.ctypes.data`` costs (which builds a ctypes helper object).  Only
# for element types numpy exports buffers of (not ml_dtypes' bfloat16 & co.): see
# :func:`_exports_buffers` and :func:`_data_address`.
_char_at = ctypes.c_char.from_buffer
_addressof = ctypes.addressof
_ndarray = np.ndarray


def aligned_empty(nbytes: int, zeroed: bool = True) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose data pointer is 64-byte aligned, zeroed unless
    ``zeroed`` is False (for a buffer that is written whole before anyone reads it: an
    output, which zeroing would clear with a memset of its whole size on every call)."""
    raw = (np.zeros if zeroed else np.empty)(nbytes + ALIGNMENT, dtype=np.uint8)
    offset = (-raw.__array_interface__["data"][0]) % ALIGNMENT
    return raw[offset:offset + nbytes]


# The counters of ``ember_thread_stats``, in its order (ember/codegen/c_threads.py).
THREAD_STATS = ("parallel_loops", "serial_loops", "worker_chunks", "caller_blocks",
                "worker_sleeps", "threads_started")


def check_thread_count(count: int | None, allow_zero: bool = False) -> int | None:
    """``count`` as a thread count (None: the default), or an InputError saying why not."""
    if count is None:
        return None
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or \
            count < (0 if allow_zero else 1) or count > 1024:
        raise InputError(f"threads must be a whole number from 1 to 1024 (or None for the "
                         f"CPUs this process may use), not {count!r}")
    return int(count)


class CompiledModel:
    """A loaded artifact, callable on numpy arrays.  Thread-safe (one run at a time).

    ``model(*arrays, **named)`` returns the output array of a one-output model and a tuple of
    arrays otherwise; ``model.run(feeds)`` takes a dict name -> array (or a list/tuple in input
    order) and returns a dict name -> array; both take ``out=``, arrays to write the outputs
    into (see :meth:`__call__`).  See :mod:`ember.runtime.binding`.
    """

    def __init__(self, path: str | Path | Artifact, host_resolver: HostResolver | None = None,
                 *, expected_digest: str | None = None, threads: int | None = None,
                 weights_cache: WeightsCache | None = None):
        """Load the artifact directory ``path``, or an :class:`Artifact` already checked in
        memory (``ember.runtime.artifact.artifact_from_memory``).  ``threads``: as
        :meth:`set_num_threads` (default: the CPUs this process may use).
        ``weights_cache``: weights blobs already loaded by other models, which this one
        shares when its weights are the same (see :func:`weights_key`)."""
        threads = check_thread_count(threads)
        if isinstance(path, Artifact):
            if expected_digest is not None and path.manifest.digest != expected_digest.lower():
                raise ModelLoadError(f"artifact '{path.root}' is not the expected one: its "
                                     f"manifest digest is {path.manifest.digest}, expected "
                                     f"{expected_digest}")
            artifact = path
        else:
            artifact = read_artifact(path, expected_digest)
        self.path = artifact.root
        self.manifest: Manifest = artifact.manifest
        self.inputs: tuple[TensorSpec, ...] = self.manifest.inputs
        self.outputs: tuple[TensorSpec, ...] = self.manifest.outputs
        self._checks: dict[int, list[IndexCheck]] = {}  # by node index, for messages
        for check in self.manifest.checks:
            self._checks.setdefault(check.node_index, []).append(check)
        self._lock = threading.Lock()
        self._threads = 0  # ember_set_num_threads's argument: 0 is the library's default
        self._set_threads: Callable[[int], None] | None = None
        self._steps: int | None = None  # from the signature; None: cannot be profiled
        self._lib = self._load_library(artifact)
        self._weights = self._shared_weights(artifact, weights_cache)
        self._host_nodes = self._resolve_host_nodes(host_resolver)
        self._workspace = _allocate(self.manifest.workspace_size, "workspace", self.path)
        # Fixed for the model's life: computed once, not on every call.
        self._weights_address = self._weights.ctypes.data
        self._workspace_address = self._workspace.ctypes.data
        self._input_pointers = ctypes.c_void_p * max(len(self.inputs), 1)
        self._output_pointers = ctypes.c_void_p * max(len(self.outputs), 1)
        self._input_dtypes = {spec.name: numpy_dtype(spec.dtype) for spec in self.inputs}
        self._host_error: BaseException | None = None
        self._host_callback = HOST_FN(self._on_host_call)
        # What every call needs, prepared once: names in order, the (dtype, shape) an input
        # must have to be passed as it is (None: a zero-size input or one of an element type
        # without buffer exports, always the checked path),
        # (bytes, dtype, shape) of every output, and the pointer arrays ember_run reads
        # (filled under the lock, so threads do not share a half-filled one).
        self._input_names = tuple(spec.name for spec in self.inputs)
        self._output_names = tuple(spec.name for spec in self.outputs)
        self._out_is_input = "out" in self._input_names
        self._fast_inputs = tuple(
            (numpy_dtype(spec.dtype), spec.shape)
            if spec.size and _exports_buffers(numpy_dtype(spec.dtype)) else None
            for spec in self.inputs)
        self._input_nbytes = tuple(spec.nbytes for spec in self.inputs)
        self._output_layouts = tuple((spec.nbytes, numpy_dtype(spec.dtype), spec.shape)
                                     for spec in self.outputs)
        self._input_slots = self._input_pointers()
        self._output_slots = self._output_pointers()
        self._run_entry = self._lib.ember_run
        self._library_threads = _threads_of(self._lib)
        if threads is not None:
            self.set_num_threads(threads)

    @property
    def digest(self) -> str:
        """The artifact's manifest digest (covers every file; pass it as ``expected_digest``
        to load exactly this artifact again)."""
        return self.manifest.digest

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    @property
    def steps(self) -> int | None:
        """How many steps (kernels and fallback nodes) a run takes; None for a library of an
        ember from before profiling, which does not say."""
        return self._steps

    @property
    def supports_profiling(self) -> bool:
        return self._steps is not None and hasattr(self._lib, "ember_run_profiled")

    @property
    def output_names(self) -> list[str]:
        return [spec.name for spec in self.outputs]

    # ------------------------------------------------------------------ loading
    def _load_library(self, artifact: Artifact) -> ctypes.CDLL:
        source = artifact.source(LIBRARY_FILE)
        lib = load_library(artifact.library, self.manifest.files[LIBRARY_FILE], source)
        for symbol in ("ember_run", "ember_workspace_size"):
            if not hasattr(lib, symbol):
                raise ModelLoadError(f"{source} does not export {symbol}; it is not an ember "
                                     f"library")
        if not hasattr(lib, "ember_signature"):
            raise ModelLoadError(f"{source} has no ember_signature(): it was built by an older "
                                 f"ember; rebuild the artifact with this ember")
        lib.ember_signature.restype = ctypes.c_void_p
        lib.ember_signature.argtypes = []
        lib.ember_workspace_size.restype = ctypes.c_int64
        lib.ember_workspace_size.argtypes = []
        address = lib.ember_signature()
        if not address:
            raise ModelLoadError(f"{source}: ember_signature() returned NULL")
        text = ctypes.string_at(address)
        if len(text) > MAX_SIGNATURE_BYTES:
            raise ModelLoadError(f"{source}: ember_signature() is implausibly long")
        signature = parse_signature(text, source)
        check_manifest(self.manifest, signature, int(lib.ember_workspace_size()), source)
        lib.ember_run.restype = ctypes.c_int32
        run_arguments = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
                         ctypes.c_void_p, ctypes.c_void_p, HOST_FN, ctypes.c_void_p]
        lib.ember_run.argtypes = run_arguments
        if signature.steps is not None and hasattr(lib, "ember_run_profiled"):
            lib.ember_run_profiled.restype = ctypes.c_int32
            lib.ember_run_profiled.argtypes = [*run_arguments, ctypes.c_void_p]
            self._steps = signature.steps
        # what the library's code assumes of an input pointer (64 for older libraries)
        self._input_alignment = signature.input_alignment
        if hasattr(lib, "ember_set_num_threads"):
            lib.ember_set_num_threads.argtypes = [ctypes.c_int32]
            lib.ember_get_num_threads.restype = ctypes.c_int32
            lib.ember_get_num_threads.argtypes = []
            self._set_threads = lib.ember_set_num_threads
        if hasattr(lib, "ember_thread_stats"):
            lib.ember_thread_stats.restype = ctypes.c_int32
            lib.ember_thread_stats.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int32]
        return lib

    def _shared_weights(self, artifact: Artifact, cache: WeightsCache | None) -> np.ndarray:
        """The weights blob: one already in ``cache`` under this artifact's key, else loaded
        (and put there).  A shared blob is read-only: the generated code takes it as
        ``const``."""
        if cache is None:
            return self._load_weights(artifact)
        key = weights_key(self.manifest)
        blob = cache.get(key)
        if blob is None:
            blob = self._load_weights(artifact)
            blob.flags.writeable = False
            cache[key] = blob
        return blob

    def _load_weights(self, artifact: Artifact) -> np.ndarray:
        source = artifact.source(WEIGHTS_FILE)
        tensors = parse_safetensors(artifact.weights, source)
        blob = _allocate(self.manifest.weights_size, "weights", self.path)
        listed = {entry.key for entry in self.manifest.weights}
        extra = sorted(set(tensors) - listed)
        if extra:
            raise ModelLoadError(f"{source} holds tensor(s) {extra} that the manifest does not "
                                 f"list; save the artifact again")
        for entry in self.manifest.weights:
            if entry.key not in tensors:
                raise ModelLoadError(f"{source} has no tensor {entry.key!r} (weight "
                                     f"{entry.name!r} of the manifest)")
            tensor = tensors[entry.key]
            stored_as_bytes = tensor.dtype == np.uint8 and entry.dtype != "uint8"
            if not stored_as_bytes and (tensor.dtype.name != entry.dtype
                                        or tuple(tensor.shape) != tuple(entry.shape)):
                raise ModelLoadError(f"{source}: tensor {entry.key!r} is {tensor.dtype.name}"
                                     f"{list(tensor.shape)}, the manifest's weight "
                                     f"{entry.name!r} is {entry.dtype}{list(entry.shape)}")
            raw = np.ascontiguousarray(tensor).reshape(-1).view(np.uint8)
            if raw.size != entry.nbytes:
                raise ModelLoadError(f"{source}: tensor {entry.key!r} has {raw.size} bytes, the "
                                     f"manifest's weight {entry.name!r} has {entry.nbytes}")
            blob[entry.offset:entry.offset + raw.size] = raw
        return blob

    def _resolve_host_nodes(self, resolver: HostResolver | None
                            ) -> dict[int, tuple[HostNodeEntry, HostFunction]]:
        entries = self.manifest.host_nodes
        if not entries:
            return {}
        if resolver is None:
            ops = sorted({e.op for e in entries})
            raise ModelLoadError(
                f"artifact '{self.path}' runs {len(entries)} node(s) through ember's numpy "
                f"references (ops: {', '.join(ops)}), which needs the ember compiler package; "
                f"load it with ember.load() instead of ember.runtime.load()")
        resolved = {}
        for entry in entries:
            try:
                resolved[entry.index] = (entry, resolver(entry))
            except ModelLoadError as error:
                raise ModelLoadError(f"artifact '{self.path}': {error}") from None
            except EmberError:
                raise
            except Exception as error:  # a resolver must not leak a bare KeyError & co.
                raise ModelLoadError(f"artifact '{self.path}': fallback node {entry.index} "
                                     f"({entry.op!r}) cannot be rebuilt: "
                                     f"{type(error).__name__}: {error}") from None
        return resolved

    # ------------------------------------------------------------------ running
    def set_num_threads(self, count: int | None) -> None:
        """Threads the compiled kernels run on, the calling thread included (``None`` or 0:
        the default, the CPUs this process may use -- its affinity mask, capped by its
        cgroup CPU quota).  Takes effect at the next call.  Models loaded from identical
        library bytes share the library; each call sets its own model's count on it."""
        count = check_thread_count(count, allow_zero=True)
        with self._lock:
            self._threads = int(count or 0)
            if self._set_threads is not None:
                self._set_threads(self._threads)
                self._library_threads.count = self._threads

    @property
    def num_threads(self) -> int:
        """The threads this model's next call will use."""
        if self._set_threads is None:
            return 1
        with self._lock:
            self._set_threads(self._threads)
            self._library_threads.count = self._threads
            return int(self._lib.ember_get_num_threads())

    def thread_stats(self) -> dict[str, int]:
        """The library's thread-pool counters since it loaded (``ember_thread_stats``):
        loops run in parallel and serially, chunks run by workers, times the calling thread
        blocked waiting for a worker's chunk, times a worker went to sleep, threads started.
        Empty for a library of an ember from before the pool."""
        if not hasattr(self._lib, "ember_thread_stats"):
            return {}
        values = (ctypes.c_int64 * len(THREAD_STATS))()
        self._lib.ember_thread_stats(values, len(THREAD_STATS))
        return dict(zip(THREAD_STATS, (int(v) for v in values)))

    def run(self, feeds: Any, *, out: Any = None) -> dict[str, np.ndarray]:
        """Run on a dict name -> array (or a list/tuple in input order); outputs by name.
        ``out``: arrays to write the outputs into, as for :meth:`__call__`."""
        outputs = self._execute(bind_run(self._input_names, feeds, ordered=True),
                                None if out is None else bind_outputs(self._output_names, out))
        return dict(zip(self._output_names, outputs))

    def __call__(self, /, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        """Run on positional and/or named arrays: the output array of a one-output model,
        else a tuple of arrays in output order.

        ``out`` (optional) takes the outputs instead of new arrays: an array (one-output
        model), a list/tuple in output order (None where a new array will do) or a dict
        output name -> array.  Each must be a writable, C-contiguous numpy array of the
        output's exact dtype and shape (else an InputError naming the output); the results
        are written into them and the same arrays returned.  (If the call raises, their
        contents are unspecified.)  An array whose data is 64-byte aligned -- as the arrays
        a call returns are -- and that shares no memory with an input is written directly;
        any other gets the results copied in.  A model with an input named ``out`` takes it
        as that input: pass ``out`` to :meth:`run` instead.
        """
        if out is not None and self._out_is_input:
            kwargs["out"], out = out, None
        if kwargs or len(args) != len(self._input_names):
            feeds = bind_call(self._input_names, args, kwargs)
            args = tuple(feeds[name] for name in self._input_names)
        outputs = self._execute(args, None if out is None else
                                bind_outputs(self._output_names, out))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def profile(self, feeds: Any, repeat: int = 10, warmup: int = 2) -> StepTimes:
        """Time every step of a run on ``feeds`` (as for :meth:`run`).

        Runs ``warmup`` untimed rounds, then ``repeat`` rounds of one ordinary run and one
        profiled run; ``.step_seconds`` of the result are the per-step medians (in step
        order: the build's kernels and fallback nodes) and ``.call_seconds`` the median of
        the whole calls.  A failing step raises as :meth:`run` would.
        """
        check_counts(repeat, warmup)
        if not self.supports_profiling:
            raise ExecutionError(
                f"compiled model '{self.path.name}' cannot be profiled: its library has no "
                f"ember_run_profiled (built by an older ember, or for a platform without a "
                f"monotonic clock); compile and save the model again with this ember")
        bound = bind_run(self.input_names, feeds)
        arrays = [self._input_array(spec, bound[spec.name]) for spec in self.inputs]
        addresses = [array.ctypes.data for array in arrays]
        steps = self._steps or 0

        def profiled(slots: np.ndarray) -> dict[str, np.ndarray]:
            outputs = [_output_buffer(*layout) for layout in self._output_layouts]
            self._call(self._lib.ember_run_profiled, addresses,
                       [address for _, address in outputs], slots.ctypes.data)
            return {spec.name: array for spec, (array, _) in zip(self.outputs, outputs)}

        return measure_steps(profiled, lambda: self._run(bound), steps, repeat, warmup)

    def _run(self, feeds: Mapping[str, Any], out: Mapping[str, np.ndarray] | None = None
             ) -> dict[str, np.ndarray]:
        """Run on inputs bound by name; ``out``: caller-given arrays of some outputs, by
        name (checked here)."""
        targets = None if not out else [out.get(name) for name in self._output_names]
        outputs = self._execute([feeds[name] for name in self._input_names], targets)
        return dict(zip(self._output_names, outputs))

    def _execute(self, values: Sequence[Any], out: Sequence[Any] | None = None
                 ) -> list[np.ndarray]:
        """Run on the input values in input order; the outputs in output order.  ``out``:
        one entry per output, a caller's array to write it into or None (a new array).

        The per-call cost of a small model is this path, so it does what :meth:`_call` does
        inline.  An input that is exactly what the code reads -- a plain, C-contiguous,
        aligned, writable array of the input's dtype and shape -- is passed where it lies
        after a handful of attribute checks; anything else takes :meth:`_input_array`, which
        checks it fully and copies it when it must.
        """
        addresses = []
        kept = []  # inputs copied here must live until the call returns
        alignment = self._input_alignment
        for index, fast in enumerate(self._fast_inputs):
            value = values[index]
            if fast is not None and type(value) is _ndarray and value.flags.carray and \
                    value.dtype == fast[0] and value.shape == fast[1]:
                address = _addressof(_char_at(value))
                if address % alignment == 0:
                    addresses.append(address)
                    continue
            array = self._input_array(self.inputs[index], value)
            kept.append(array)
            addresses.append(array.ctypes.data)
        copies = None
        if out is None:
            results = []
            out_addresses = []
            for nbytes, dtype, shape in self._output_layouts:
                array, address = _output_buffer(nbytes, dtype, shape)
                results.append(array)
                out_addresses.append(address)
        else:
            results, out_addresses, copies = _caller_outputs(
                self._output_names, self._output_layouts, out, addresses, self._input_nbytes)
        with self._lock:
            in_ptrs = self._input_slots
            in_ptrs[:len(addresses)] = addresses
            out_ptrs = self._output_slots
            out_ptrs[:len(out_addresses)] = out_addresses
            if self._library_threads.count != self._threads and self._set_threads is not None:
                self._set_threads(self._threads)  # another model on the library set its own
                self._library_threads.count = self._threads
            status = self._run_entry(in_ptrs, out_ptrs, self._weights_address,
                                     self._workspace_address, self._host_callback, None)
            if status != 0:
                error, self._host_error = self._host_error, None
        if status != 0:
            raise self._status_error(status, error)
        if copies:
            for target, scratch in copies:
                np.copyto(target, scratch)
        return results

    def _call(self, entry: Any, inputs: Sequence[int], outputs: Sequence[int],
              *extra: Any, workspace_size: int = 0) -> None:
        """Call ``entry`` (ember_run or ember_run_profiled, then ``extra`` arguments) on the
        buffers at these addresses (the inputs, then the outputs, in order); a non-zero
        status becomes the error it stands for.  ``workspace_size``: the bytes this call's
        workspace needs when more than the manifest's (a build that takes dims at run
        time); the workspace grows to it.  (:meth:`_execute` does the same inline.)"""
        with self._lock:
            in_ptrs, out_ptrs = self._input_slots, self._output_slots
            in_ptrs[:len(inputs)] = inputs
            out_ptrs[:len(outputs)] = outputs
            if workspace_size > self._workspace.nbytes:
                self._workspace = aligned_empty(workspace_size)
                self._workspace_address = self._workspace.ctypes.data
            # this model's thread count, whoever shares the library
            if self._set_threads is not None and self._library_threads.count != self._threads:
                self._set_threads(self._threads)
                self._library_threads.count = self._threads
            status = entry(in_ptrs, out_ptrs, self._weights_address, self._workspace_address,
                           self._host_callback, None, *extra)
            if status != 0:  # the error a fallback node raised, if that is why (kept by
                # its callback, which then returned 1 and so made the status non-zero)
                error, self._host_error = self._host_error, None
        if status != 0:
            raise self._status_error(status, error)

    def _input_array(self, spec: TensorSpec, value: Any) -> np.ndarray:
        """``value`` checked against ``spec``: itself when the code can read it where it
        lies, else a contiguous, aligned copy (or an InputError naming the input)."""
        if type(value) is np.ndarray and value.dtype == self._input_dtypes[spec.name] and \
                value.shape == spec.shape and value.flags.c_contiguous and \
                value.flags.aligned and value.ctypes.data % self._input_alignment == 0:
            return value
        dtype = numpy_dtype(spec.dtype)
        array = as_array(spec.name, value, spec.describe())
        check_array(spec.name, array, dtype, spec.shape)
        return _aligned_like(np.ascontiguousarray(array), self._input_alignment)

    def _status_error(self, status: int, host_error: BaseException | None) -> BaseException:
        node_index, code = divmod(status, 256)
        if status > 0 and code == STATUS_HOST_FAILED and host_error is not None:
            return host_error  # what the fallback node raised, re-raised in the caller
        if status > 0 and code == STATUS_EXCLUDED_VALUE:
            return self._excluded_value_error(node_index)
        if status > 0 and code == STATUS_INDEX_OUT_OF_RANGE:
            checks = [c for c in self._checks.get(node_index, []) if not c.outside]
            if checks:
                first = checks[0]
                ranges = ", ".join(check.describe() for check in checks)
                return ExecutionError(f"compiled model '{self.path.name}': node {node_index} "
                                      f"'{first.node}' ({first.op}) got an index out of range: "
                                      f"{ranges}")
            return ExecutionError(f"compiled model '{self.path.name}': an index input of node "
                                  f"{node_index} is out of range")
        if status > 0 and code == STATUS_HOST_FAILED:
            entry = self._host_nodes.get(node_index, (None, None))[0]
            label = f"'{entry.name}' ({entry.op})" if entry else str(node_index)
            return ExecutionError(f"compiled model '{self.path.name}': fallback node {label} "
                                  f"failed")
        return ExecutionError(f"compiled model '{self.path.name}' failed with status {status}")

    def _excluded_value_error(self, node_index: int) -> ExecutionError:
        """The error of a step whose input held a value an ``outside`` check excludes: an
        integer divisor of 0, named by node ("Div: integer division by zero in node 'd'")."""
        checks = [c for c in self._checks.get(node_index, []) if c.outside]
        if not checks:
            return ExecutionError(f"compiled model '{self.path.name}': an input of step "
                                  f"{node_index} holds a value its node cannot take")
        ops = "/".join(dict.fromkeys(c.op for c in checks))
        nodes = list(dict.fromkeys(f"'{c.node}'" for c in checks))
        what = "integer division by zero" if all(c.is_zero_divisor_check for c in checks) \
            else "an input holds a value the node cannot take"
        return ExecutionError(
            f"compiled model '{self.path.name}': {ops}: {what} in node "
            f"{' or '.join(nodes)} (step {node_index}): "
            f"{'; '.join(c.describe() for c in checks)}; check the divisor's values (or "
            f"guard it, e.g. with Where or Max) before it reaches the node")

    def _on_host_call(self, _ctx: Any, index: int, buffers: Any) -> int:
        try:
            if index not in self._host_nodes:
                raise ExecutionError(f"compiled model '{self.path.name}' called fallback node "
                                     f"{index}, which the manifest does not list")
            entry, fn = self._host_nodes[index]
            ins = [_view(buffers[i], spec) for i, spec in enumerate(entry.inputs)]
            offset = len(entry.inputs)
            outs = [_view(buffers[offset + i], spec) for i, spec in enumerate(entry.outputs)]
            results = list(fn(ins))
            if len(results) != len(outs):
                raise ExecutionError(f"fallback node '{entry.name}' ({entry.op}) produced "
                                     f"{len(results)} output(s), compiled code expects "
                                     f"{len(outs)}")
            for target, value in zip(outs, results):
                value = np.asarray(value)
                if value.shape != target.shape or value.dtype != target.dtype:
                    raise ExecutionError(
                        f"fallback node '{entry.name}' ({entry.op}) produced "
                        f"{value.dtype}{list(value.shape)}, compiled code expects "
                        f"{target.dtype}{list(target.shape)}")
                np.copyto(target, value)
            return 0
        except BaseException as error:  # never let an exception cross the C boundary
            self._host_error = error
            return 1


# Weights blobs by :func:`weights_key`, for loaded models to share.
WeightsCache = dict[tuple, np.ndarray]


def weights_key(manifest: Manifest) -> tuple:
    """What makes two artifacts' weights blobs byte for byte the same: the same weights file
    (its SHA-256, which the loader checked against the file's bytes) laid out by the same
    manifest entries into a blob of the same size.  The blocks of a batch-blocked artifact
    usually agree (their packed layouts do not depend on the batch), so they load the
    weights once instead of once per block."""
    return manifest.files[WEIGHTS_FILE], manifest.weights_size, manifest.weights


def _allocate(nbytes: int, what: str, root: Path) -> np.ndarray:
    try:
        return aligned_empty(nbytes)
    except (MemoryError, ValueError):
        raise ModelLoadError(f"artifact '{root}': cannot allocate the {what} of {nbytes:,} "
                             f"bytes it needs") from None


def _view(pointer: int | None, spec: TensorSpec) -> np.ndarray:
    dtype = numpy_dtype(spec.dtype)
    if spec.size == 0 or not pointer:
        return np.empty(spec.shape, dtype)
    raw = (ctypes.c_uint8 * spec.nbytes).from_address(pointer)
    return np.frombuffer(raw, dtype=dtype, count=spec.size).reshape(spec.shape)


def _output_buffer(nbytes: int, dtype: np.dtype, shape: tuple[int, ...]
                   ) -> tuple[np.ndarray, int]:
    """A new, uninitialized, 64-byte aligned output array and its data's address.  (Every
    output is written whole by ember_run before the caller sees it: a failed run raises
    instead of returning its outputs.)"""
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    address = _addressof(_char_at(raw))
    offset = -address % ALIGNMENT
    return _ndarray(shape, dtype, raw, offset), address + offset


def _caller_outputs(names: Sequence[str], layouts: Sequence[tuple[int, np.dtype, tuple]],
                    out: Sequence[Any], inputs: Sequence[int], input_bytes: Sequence[int]
                    ) -> tuple[list[Any], list[int], list[tuple[np.ndarray, np.ndarray]]]:
    """The output buffers of a call with caller-given arrays ``out`` (None: a new array):
    the arrays to return, the addresses to write and the (caller's array, scratch) pairs
    to copy after the run.  Each given array is checked (:func:`check_output`); one is
    written directly when the code may write it where it lies -- 64-byte aligned (what
    kernels assume of an output) and sharing no memory with an input (``inputs``: the
    address of each as passed, ``input_bytes`` its size; the kernels' pointers are
    ``restrict``) -- and otherwise through an aligned scratch array.  Two outputs given
    the same memory is an error."""
    results: list[Any] = []
    addresses: list[int] = []
    copies: list[tuple[np.ndarray, np.ndarray]] = []
    given: list[tuple[int, int, str]] = []  # (start, end, name) of each non-empty one
    for name, (nbytes, dtype, shape), target in zip(names, layouts, out):
        if target is None:
            array, address = _output_buffer(nbytes, dtype, shape)
            results.append(array)
            addresses.append(address)
            continue
        array = check_output(name, target, dtype, shape)
        results.append(target)
        direct = nbytes != 0
        if direct:
            address = _data_address(array)
            end = address + nbytes
            for start, stop, other in given:
                if address < stop and start < end:
                    raise InputError(f"out= gives outputs '{other}' and '{name}' arrays that "
                                     f"share memory; each output needs its own array")
            given.append((address, end, name))
            if address % ALIGNMENT:
                direct = False
            else:
                for start, size in zip(inputs, input_bytes):
                    if address < start + size and start < end:
                        direct = False
                        break
        if not direct:
            scratch, address = _output_buffer(nbytes, dtype, shape)
            copies.append((array, scratch))
        addresses.append(address)
    return results, addresses, copies


def _exports_buffers(dtype: np.dtype) -> bool:
    """Whether numpy exports buffers of arrays of ``dtype`` (which ``_char_at`` needs)."""
    try:
        memoryview(np.zeros(1, dtype))
    except (ValueError, TypeError, BufferError):
        return False
    return True


def _data_address(array: np.ndarray) -> int:
    """The address of a writable, C-contiguous, non-empty array's data."""
    try:
        return _addressof(_char_at(array))
    except (ValueError, TypeError, BufferError):  # an element type without buffer exports
        return array.ctypes.data


class _LibraryThreads:
    """The thread count last set on a library, which the models loaded from the same bytes
    share: a call sets its own model's count only when another was set since."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count: int | None = None


_library_threads: dict[int, tuple[ctypes.CDLL, _LibraryThreads]] = {}
_library_threads_lock = threading.Lock()


def _threads_of(lib: ctypes.CDLL) -> _LibraryThreads:
    with _library_threads_lock:  # (libraries are never unloaded: their ids stay theirs)
        entry = _library_threads.setdefault(id(lib), (lib, _LibraryThreads()))
        return entry[1]


def _aligned_like(array: np.ndarray, alignment: int = ALIGNMENT) -> np.ndarray:
    """``array``, or a 64-byte aligned copy of it when its data is not aligned to
    ``alignment`` bytes or to its element type."""
    if array.nbytes == 0 or (array.flags.aligned and array.ctypes.data % alignment == 0):
        return array
    copy = aligned_empty(array.nbytes, zeroed=False).view(array.dtype).reshape(array.shape)
    np.copyto(copy, array)
    return copy
