"""Run a compiled artifact: bind inputs and outputs, own the workspace, call ``ember_run``.

The library's entry point is

    int32_t ember_run(void *const *inputs, void *const *outputs, const uint8_t *weights,
                      uint8_t *workspace, ember_host_fn host, void *host_ctx);

with every buffer 64-byte aligned.  ``host`` is called for nodes that run their numpy
reference instead of compiled code (fallbacks, listed in the manifest); the runtime forwards
those calls to a Python callable given at load time, since only the compiler knows the op
references.  A non-zero return aborts the run and is raised as an error.
"""

from __future__ import annotations

import ctypes
import json
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ember.runtime.artifact import read_manifest
from ember.runtime.errors import ExecutionError, InputError, ModelLoadError
from ember.runtime.safetensors_io import read_safetensors

ALIGNMENT = 64
HOST_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32,
                           ctypes.POINTER(ctypes.c_void_p))

# A host resolver turns a host-node entry of the manifest into a function from input arrays to
# output arrays.  ember.load() provides one built on the op registry.
HostResolver = Callable[[dict[str, Any]], Callable[[list[np.ndarray]], list[np.ndarray]]]


def aligned_empty(nbytes: int) -> np.ndarray:
    """A zeroed uint8 array of ``nbytes`` whose data pointer is 64-byte aligned."""
    raw = np.zeros(nbytes + ALIGNMENT, dtype=np.uint8)
    offset = (-raw.ctypes.data) % ALIGNMENT
    return raw[offset:offset + nbytes]


def _numpy_dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # only artifacts with exotic dtypes need it

        return np.dtype(getattr(ml_dtypes, name))


class CompiledModel:
    """A loaded artifact, callable on numpy arrays.  Thread-safe (one run at a time)."""

    def __init__(self, path: str | Path, host_resolver: HostResolver | None = None):
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.inputs = self.manifest["inputs"]
        self.outputs = self.manifest["outputs"]
        self._lock = threading.Lock()
        self._lib = self._load_library()
        self._weights = self._load_weights()
        self._workspace = aligned_empty(int(self.manifest["workspace_size"]))
        self._host_nodes = self._resolve_host_nodes(host_resolver)
        self._host_error: BaseException | None = None
        self._host_callback = HOST_FN(self._on_host_call)

    # ------------------------------------------------------------------ loading
    def _load_library(self) -> ctypes.CDLL:
        library = self.path / self.manifest["library"]
        try:
            lib = ctypes.CDLL(str(library))
        except OSError as error:
            raise ModelLoadError(f"cannot load the compiled library '{library}': {error}") from None
        lib.ember_run.restype = ctypes.c_int32
        lib.ember_run.argtypes = [ctypes.POINTER(ctypes.c_void_p),
                                  ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                  ctypes.c_void_p, HOST_FN, ctypes.c_void_p]
        if hasattr(lib, "ember_set_num_threads"):
            lib.ember_set_num_threads.argtypes = [ctypes.c_int32]
        return lib

    def _load_weights(self) -> np.ndarray:
        layout = self.manifest.get("weights", {})
        blob = aligned_empty(int(self.manifest.get("weights_size", 0)))
        if not layout:
            return blob
        tensors = read_safetensors(self.path / self.manifest["weights_file"])
        for name, entry in layout.items():
            raw = tensors[entry["key"]].view(np.uint8).reshape(-1)
            if raw.size != entry["nbytes"]:
                raise ModelLoadError(f"weight '{name}' has {raw.size} bytes, the manifest "
                                     f"says {entry['nbytes']}")
            blob[entry["offset"]:entry["offset"] + raw.size] = raw
        return blob

    def _resolve_host_nodes(self, resolver: HostResolver | None):
        entries = self.manifest.get("host_nodes", [])
        if not entries:
            return {}
        if resolver is None:
            ops = sorted({e["op"] for e in entries})
            raise ModelLoadError(
                f"artifact '{self.path}' runs {len(entries)} node(s) through ember's numpy "
                f"references (ops: {', '.join(ops)}), which needs the ember compiler package; "
                f"load it with ember.load() instead of ember.runtime.load()")
        details_path = self.path / "host_nodes.json"
        details = json.loads(details_path.read_text()) if details_path.exists() else {}
        return {int(e["index"]): (e, resolver({**e, **details.get(str(e["index"]), {})}))
                for e in entries}

    # ------------------------------------------------------------------ running
    def set_num_threads(self, count: int) -> None:
        """Threads the compiled kernels may use (default: all cores)."""
        if hasattr(self._lib, "ember_set_num_threads"):
            self._lib.ember_set_num_threads(int(count))

    def run(self, feeds: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """Run on named (or positional) inputs; returns outputs by name."""
        arrays = self._bind_inputs(feeds)
        outputs = [_aligned_array(o["shape"], _numpy_dtype(o["dtype"])) for o in self.outputs]
        in_ptrs = (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])
        out_ptrs = (ctypes.c_void_p * max(len(outputs), 1))(*[o.ctypes.data for o in outputs])
        with self._lock:
            self._host_error = None
            status = self._lib.ember_run(in_ptrs, out_ptrs, self._weights.ctypes.data,
                                         self._workspace.ctypes.data, self._host_callback, None)
            if status != 0:
                error, self._host_error = self._host_error, None
                if error is not None:
                    raise error  # what a fallback node raised, re-raised in the caller
                raise ExecutionError(f"compiled model '{self.path.name}' failed with status "
                                     f"{status}")
        return {o["name"]: arr for o, arr in zip(self.outputs, outputs)}

    __call__ = run

    def _bind_inputs(self, feeds) -> list[np.ndarray]:
        names = [i["name"] for i in self.inputs]
        if not isinstance(feeds, Mapping):
            feeds = list(feeds)
            if len(feeds) != len(names):
                raise InputError(f"the model takes {len(names)} input(s) {names}, got "
                                 f"{len(feeds)}")
            feeds = dict(zip(names, feeds))
        missing = [n for n in names if n not in feeds]
        extra = [n for n in feeds if n not in names]
        if missing or extra:
            raise InputError(f"missing input(s) {missing}, unknown input(s) {extra}; the model "
                             f"takes {names}")
        arrays = []
        for spec in self.inputs:
            value = feeds[spec["name"]]
            if isinstance(value, np.generic):  # a numpy scalar for a 0-d input
                value = np.asarray(value)
            if not isinstance(value, np.ndarray):
                raise InputError(f"input '{spec['name']}' must be a numpy array, got "
                                 f"{type(value).__name__}")
            dtype = _numpy_dtype(spec["dtype"])
            if value.dtype != dtype:
                raise InputError(f"input '{spec['name']}' has dtype {value.dtype}; the compiled "
                                 f"model expects {dtype}")
            if tuple(value.shape) != tuple(spec["shape"]):
                raise InputError(f"input '{spec['name']}' has shape {tuple(value.shape)}; the "
                                 f"compiled model expects {tuple(spec['shape'])} (recompile "
                                 f"for other shapes)")
            arrays.append(_aligned_like(np.ascontiguousarray(value)))
        return arrays

    def _on_host_call(self, _ctx, index: int, buffers) -> int:
        try:
            entry, fn = self._host_nodes[index]
            ins = [_view(buffers[i], spec) for i, spec in enumerate(entry["inputs"])]
            offset = len(entry["inputs"])
            outs = [_view(buffers[offset + i], spec) for i, spec in enumerate(entry["outputs"])]
            results = fn(ins)
            for target, value, spec in zip(outs, results, entry["outputs"]):
                value = np.asarray(value)
                if value.shape != target.shape or value.dtype != target.dtype:
                    raise ExecutionError(
                        f"fallback node '{entry['name']}' ({entry['op']}) produced "
                        f"{value.dtype}{list(value.shape)}, compiled code expects "
                        f"{target.dtype}{list(target.shape)}")
                np.copyto(target, value)
            return 0
        except BaseException as error:  # never let an exception cross the C boundary
            self._host_error = error
            return 1


def _view(pointer: int | None, spec: dict[str, Any]) -> np.ndarray:
    dtype = _numpy_dtype(spec["dtype"])
    shape = tuple(spec["shape"])
    count = int(np.prod(shape)) if shape else 1
    if count == 0 or not pointer:
        return np.empty(shape, dtype)
    raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(pointer)
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


def _aligned_array(shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    count = int(np.prod(shape)) if len(shape) else 1
    return aligned_empty(count * dtype.itemsize).view(dtype).reshape(tuple(shape))


def _aligned_like(array: np.ndarray) -> np.ndarray:
    if array.nbytes == 0 or array.ctypes.data % ALIGNMENT == 0:
        return array
    copy = aligned_empty(array.nbytes).view(array.dtype).reshape(array.shape)
    np.copyto(copy, array)
    return copy


def load(path: str | Path, host_resolver: HostResolver | None = None) -> CompiledModel:
    """Load an artifact directory written by ``ember.Module.save``."""
    return CompiledModel(path, host_resolver)
