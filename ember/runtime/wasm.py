"""Run a WebAssembly export (``ember export --target wasm32-wasi``) from Python, in wasmtime.

The module exports the C API of ``<name>.h`` (``ember.package.c_api``); this host does what a
C program would: it copies the weights file into the module's memory (``<name>_alloc``), opens
the model from there (``<name>_open_memory``), and for each call copies the inputs in, calls
``<name>_run`` and copies the outputs out.  The module gets WASI with nothing granted: no
files, no environment, no clock beyond what WASI always gives.  The signature comes from
the export's ``export.json``; the module's own ``<name>_input_nbytes`` and friends are checked
against it, so a record that does not match its module is refused.

Needs the ``wasmtime`` package (``pip install wasmtime``).  A module runs on one thread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ember.runtime.errors import ExecutionError, InputError, ModelLoadError

_EXPORT_FILE = "export.json"
_MAX_RECORD_BYTES = 1 << 20
_API_VERSION = 1


class WasmModel:
    """A wasm32 export, instantiated once, run with numpy arrays.

    An export with run-time dims (``ember.export(..., dynamic_dims=[...])``) takes them from
    the input shapes of each call (``<name>_set_dims``); the outputs then have the shapes the
    module binds."""

    def __init__(self, directory: str | Path):
        try:
            import wasmtime
        except ImportError:
            raise ModelLoadError("running a WebAssembly export needs the wasmtime package: "
                                 "pip install wasmtime") from None
        root = Path(directory)
        record = _read_record(root)
        prefix = record["prefix"]
        self.prefix = prefix
        self.inputs = [(t["name"], np.dtype(t["dtype"]), tuple(t["shape"]))
                       for t in record["inputs"]]
        self.outputs = [(t["name"], np.dtype(t["dtype"]), tuple(t["shape"]))
                        for t in record["outputs"]]
        self.dims = [d["name"] for d in record["dims"]]
        # where each run-time dim is read: (input index, axis), its first occurrence
        self._dim_axes: dict[int, tuple[int, int]] = {}
        for i, tensor in enumerate(record["inputs"]):
            for axis, size in enumerate(tensor.get("axes", ())):
                if isinstance(size, dict) and "dim" in size:
                    self._dim_axes.setdefault(size["dim"], (i, axis))
        if len(self._dim_axes) != len(self.dims):
            raise ModelLoadError(f"'{root}': the inputs do not give every run-time dim")
        engine = wasmtime.Engine()
        self._store = wasmtime.Store(engine)
        self._store.set_wasi(wasmtime.WasiConfig())
        linker = wasmtime.Linker(engine)
        linker.define_wasi()
        try:
            module = wasmtime.Module.from_file(engine, str(root / f"{prefix}.wasm"))
            instance = linker.instantiate(self._store, module)
        except (wasmtime.WasmtimeError, OSError) as error:
            raise ModelLoadError(f"'{root}': cannot instantiate {prefix}.wasm: {error}") from None
        exports = instance.exports(self._store)

        def export(name: str) -> Any:
            try:
                return exports[f"{prefix}_{name}"]
            except KeyError:
                raise ModelLoadError(f"'{root}': {prefix}.wasm does not export "
                                     f"{prefix}_{name}; export the model again") from None

        self._export = export
        self._memory = exports["memory"]
        self._alloc, self._free = export("alloc"), export("free")
        self._run_fn, self._last_error = export("run"), export("last_error")
        if export("num_dims")(self._store) != len(self.dims):
            raise ModelLoadError(f"'{root}': {_EXPORT_FILE} lists {len(self.dims)} run-time "
                                 f"dim(s), the module has another count")
        for kind, tensors in (("input", self.inputs), ("output", self.outputs)):
            if export(f"num_{kind}s")(self._store) != len(tensors):
                raise ModelLoadError(f"'{root}': {_EXPORT_FILE} lists {len(tensors)} "
                                     f"{kind}(s), the module has another count")
            for i, tensor in enumerate(tensors):
                # (a traced export's static sizes are 0 where an axis is a run-time dim)
                if not self.dims and export(f"{kind}_nbytes")(self._store, i) != \
                        _nbytes(tensor):
                    raise ModelLoadError(f"'{root}': {kind} '{tensor[0]}' of {_EXPORT_FILE} "
                                         f"does not match the module's")
        weights = (root / f"{prefix}.weights").read_bytes()
        staged = self._copy_in(weights)
        handle_slot = self._alloc(self._store, 4)
        try:
            status = export("open_memory")(self._store, _API_VERSION, staged, len(weights),
                                           handle_slot)
            self._check(status, "opening the model")
            self._model = int.from_bytes(self._memory.read(self._store, handle_slot,
                                                           handle_slot + 4), "little")
        finally:
            self._free(self._store, staged)
            self._free(self._store, handle_slot)
        # Input and output buffers live in the module, grown when a call needs more; the
        # pointer arrays that run() takes point at them.
        self._in_buffers = [(0, 0)] * len(self.inputs)  # (address, capacity)
        self._out_buffers = [(0, 0)] * len(self.outputs)
        self._in_array = self._alloc(self._store, 4 * max(1, len(self.inputs)))
        self._out_array = self._alloc(self._store, 4 * max(1, len(self.outputs)))
        self._dims_slot = self._alloc(self._store, 8 * max(1, len(self.dims)))
        self._bound: tuple[int, ...] | None = None

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs for ``feeds`` (input name -> array of the input's dtype and shape; a
        run-time dim's axes may have any size the export serves)."""
        values = []
        for name, dtype, shape in self.inputs:
            if name not in feeds:
                raise InputError(f"missing input '{name}'")
            value = np.asarray(feeds[name], order="C")  # (ascontiguousarray makes 0-d 1-d)
            if value.dtype != dtype or value.ndim != len(shape):
                raise InputError(f"input '{name}' must be {dtype}{list(shape)}, got "
                                 f"{value.dtype}{list(value.shape)}")
            values.append(value)
        self._bind_dims(values)
        for i, ((name, dtype, shape), value) in enumerate(zip(self.inputs, values)):
            bound = self._bound_shape("input", i, len(shape))
            if value.shape != bound:
                raise InputError(f"input '{name}' must be {dtype}{list(bound)}, got "
                                 f"{value.dtype}{list(value.shape)}")
            address = self._buffer(self._in_buffers, self._in_array, i, value.nbytes)
            self._memory.write(self._store, value.tobytes(), address)
        shapes = [self._bound_shape("output", j, len(shape))
                  for j, (_, _, shape) in enumerate(self.outputs)]
        for j, ((_, dtype, _), shape) in enumerate(zip(self.outputs, shapes)):
            self._buffer(self._out_buffers, self._out_array, j,
                         int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        self._check(self._run_fn(self._store, self._model, self._in_array, self._out_array),
                    "running the model")
        results = {}
        for (name, dtype, _), shape, (address, _) in zip(self.outputs, shapes,
                                                         self._out_buffers):
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            data = self._memory.read(self._store, address, address + nbytes)
            results[name] = np.frombuffer(bytes(data), dtype=dtype).reshape(shape)
        return results

    def _bind_dims(self, values: list[np.ndarray]) -> None:
        """Set the run-time dims the inputs give (or, without dims, bind nothing)."""
        if not self.dims:
            return
        dims = tuple(int(values[i].shape[axis]) for i, axis in
                     (self._dim_axes[d] for d in range(len(self.dims))))
        if dims == self._bound:
            return
        packed = b"".join(d.to_bytes(8, "little", signed=True) for d in dims)
        self._memory.write(self._store, packed, self._dims_slot)
        self._bound = None
        self._check(self._export("set_dims")(self._store, self._model, self._dims_slot),
                    "setting the run-time dims", InputError)
        self._bound = dims

    def _bound_shape(self, kind: str, index: int, rank: int) -> tuple[int, ...]:
        address = self._export(f"bound_{kind}_shape")(self._store, self._model, index)
        raw = bytes(self._memory.read(self._store, address, address + 8 * rank))
        return tuple(int.from_bytes(raw[8 * k:8 * k + 8], "little", signed=True)
                     for k in range(rank))

    def _buffer(self, buffers: list[tuple[int, int]], array: int, index: int,
                nbytes: int) -> int:
        """The address of buffer ``index`` with room for ``nbytes`` (grown, and its slot of
        the pointer array updated, when it has less)."""
        address, capacity = buffers[index]
        if capacity < max(1, nbytes):
            if address:
                self._free(self._store, address)
            address = self._alloc(self._store, max(1, nbytes))
            if address == 0:
                raise ExecutionError(f"the module cannot allocate {nbytes:,} bytes")
            buffers[index] = (address, max(1, nbytes))
            self._memory.write(self._store, int(address).to_bytes(4, "little"),
                               array + 4 * index)
        return address

    def _copy_in(self, data: bytes) -> int:
        address = self._alloc(self._store, max(1, len(data)))
        if address == 0:
            raise ModelLoadError(f"the module cannot allocate {len(data):,} bytes")
        self._memory.write(self._store, data, address)
        return address

    def _check(self, status: int, doing: str, error: type | None = None) -> None:
        if status == 0:
            return
        start = self._last_error(self._store)
        raw = self._memory.read(self._store, start, start + 512)
        message = bytes(raw).split(b"\0", 1)[0].decode("utf-8", "replace")
        if error is None:
            error = ExecutionError if doing == "running the model" else ModelLoadError
        raise error(f"{self.prefix}.wasm failed {doing} (status {status}): {message}")


def _nbytes(tensor: tuple[str, np.dtype, tuple[int, ...]]) -> int:
    return int(np.prod(tensor[2], dtype=np.int64)) * tensor[1].itemsize


def _read_record(root: Path) -> dict[str, Any]:
    path = root / _EXPORT_FILE
    try:
        with open(path, "rb") as file:
            data = file.read(_MAX_RECORD_BYTES + 1)
    except OSError as error:
        raise ModelLoadError(f"'{root}' is not an ember export ({_EXPORT_FILE}: "
                             f"{error.strerror})") from None
    try:
        record = json.loads(data)
        prefix = record["prefix"]
        if not isinstance(prefix, str) or not prefix.isidentifier() or \
                record.get("target", {}).get("arch") != "wasm32":
            raise ValueError("not a wasm32 export")
        if not isinstance(record.get("dims", []), list) or \
                not all(isinstance(d, dict) and isinstance(d.get("name"), str)
                        for d in record.get("dims", [])):
            raise ValueError("bad dims")
        record.setdefault("dims", [])
        for tensor in (*record["inputs"], *record["outputs"]):
            np.dtype(tensor["dtype"])
            if not all(isinstance(d, int) and d >= 0 for d in tensor["shape"]):
                raise ValueError("bad shape")
    except (ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(f"'{path}' is not the record of a wasm32 export: {error}") from None
    return record
