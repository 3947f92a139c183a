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
    """A wasm32 export, instantiated once, run with numpy arrays."""

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

        self._memory = exports["memory"]
        self._alloc, self._free = export("alloc"), export("free")
        self._run_fn, self._last_error = export("run"), export("last_error")
        for kind, tensors in (("input", self.inputs), ("output", self.outputs)):
            if export(f"num_{kind}s")(self._store) != len(tensors):
                raise ModelLoadError(f"'{root}': {_EXPORT_FILE} lists {len(tensors)} "
                                     f"{kind}(s), the module has another count")
            for i, (name, dtype, shape) in enumerate(tensors):
                nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                if export(f"{kind}_nbytes")(self._store, i) != nbytes:
                    raise ModelLoadError(f"'{root}': {kind} '{name}' of {_EXPORT_FILE} does "
                                         f"not match the module's")
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
        # Input and output buffers live in the module for the model's lifetime; the pointer
        # arrays that run() takes point at them.
        self._in_buffers = [self._alloc(self._store, max(1, _nbytes(t))) for t in self.inputs]
        self._out_buffers = [self._alloc(self._store, max(1, _nbytes(t))) for t in self.outputs]
        self._in_array = self._pointer_array(self._in_buffers)
        self._out_array = self._pointer_array(self._out_buffers)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs for ``feeds`` (input name -> array of the input's dtype and shape)."""
        for (name, dtype, shape), address in zip(self.inputs, self._in_buffers):
            if name not in feeds:
                raise InputError(f"missing input '{name}'")
            value = np.asarray(feeds[name], order="C")  # (ascontiguousarray makes 0-d 1-d)
            if value.dtype != dtype or value.shape != shape:
                raise InputError(f"input '{name}' must be {dtype}{list(shape)}, got "
                                 f"{value.dtype}{list(value.shape)}")
            self._memory.write(self._store, value.tobytes(), address)
        self._check(self._run_fn(self._store, self._model, self._in_array, self._out_array),
                    "running the model")
        results = {}
        for (name, dtype, shape), address in zip(self.outputs, self._out_buffers):
            data = self._memory.read(self._store, address, address + _nbytes((name, dtype,
                                                                              shape)))
            results[name] = np.frombuffer(bytes(data), dtype=dtype).reshape(shape)
        return results

    def _copy_in(self, data: bytes) -> int:
        address = self._alloc(self._store, max(1, len(data)))
        if address == 0:
            raise ModelLoadError(f"the module cannot allocate {len(data):,} bytes")
        self._memory.write(self._store, data, address)
        return address

    def _pointer_array(self, addresses: list[int]) -> int:
        packed = b"".join(int(a).to_bytes(4, "little") for a in addresses) or b"\0" * 4
        return self._copy_in(packed)

    def _check(self, status: int, doing: str) -> None:
        if status == 0:
            return
        start = self._last_error(self._store)
        raw = self._memory.read(self._store, start, start + 512)
        message = bytes(raw).split(b"\0", 1)[0].decode("utf-8", "replace")
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
        for tensor in (*record["inputs"], *record["outputs"]):
            np.dtype(tensor["dtype"])
            if not all(isinstance(d, int) and d >= 0 for d in tensor["shape"]):
                raise ValueError("bad shape")
    except (ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(f"'{path}' is not the record of a wasm32 export: {error}") from None
    return record
