"""A compiled model whose library takes some dims at run time.

A build traced over symbolic dims (``ember.core.traced``) computes its loop extents, strides
and workspace offsets from an array of dims, ``const int64_t em_dims[]``, which ``ember_run``
reads from the slot after the last input pointer.  The compiler side knows how the input
shapes give those dims, which output shapes and workspace size they mean and under which
guards the code is valid; it hands that knowledge to this class as a *resolver*, so that the
runtime still imports nothing of the compiler.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ember.runtime.binding import as_array, check_array
from ember.runtime.dtypes import numpy_dtype
from ember.runtime.errors import ExecutionError
from ember.runtime.model import CompiledModel, _aligned_like, aligned_empty


@dataclass(frozen=True)
class DimsBinding:
    """What one call's input shapes mean for the library: the dims array, every output's
    shape and the workspace size in bytes."""

    dims: tuple[int, ...]
    outputs: tuple[tuple[int, ...], ...]
    workspace_size: int


# input name -> shape  ->  binding (raises InputError when the build does not serve them)
DimsResolver = Callable[[Mapping[str, tuple[int, ...]]], DimsBinding]


class RuntimeDimsModel(CompiledModel):
    """A :class:`CompiledModel` over a library that takes dims at run time (see module doc).

    The workspace grows to the largest size a call has needed.  Profiling is not offered:
    the per-step report describes the shapes of one specialization."""

    def __init__(self, artifact: Any, resolver: DimsResolver, **kwargs: Any):
        super().__init__(artifact, **kwargs)
        self._resolver = resolver
        self._input_pointers = ctypes.c_void_p * (len(self.inputs) + 1)

    @property
    def supports_profiling(self) -> bool:
        return False

    def _run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        arrays = {}
        for spec in self.inputs:
            array = as_array(spec.name, feeds[spec.name], spec.describe())
            arrays[spec.name] = array
        binding = self._resolver({name: tuple(a.shape) for name, a in arrays.items()})
        inputs = []
        for spec in self.inputs:
            array = arrays[spec.name]
            check_array(spec.name, array, numpy_dtype(spec.dtype), tuple(array.shape))
            inputs.append(_aligned_like(np.ascontiguousarray(array), self._input_alignment))
        outputs = [_empty(shape, numpy_dtype(spec.dtype))
                   for spec, shape in zip(self.outputs, binding.outputs)]
        dims = np.array(binding.dims, dtype=np.int64)
        in_ptrs = self._input_pointers(*[a.ctypes.data for a in inputs], dims.ctypes.data)
        out_ptrs = self._output_pointers(*[o.ctypes.data for o in outputs])
        with self._lock:
            if self._workspace.nbytes < binding.workspace_size:
                self._workspace = aligned_empty(binding.workspace_size)
                self._workspace_address = self._workspace.ctypes.data
            self._host_error = None
            status = self._lib.ember_run(in_ptrs, out_ptrs, self._weights_address,
                                         self._workspace_address, self._host_callback, None)
            error, self._host_error = self._host_error, None
        if status != 0:
            raise self._status_error(status, error)
        return {spec.name: array for spec, array in zip(self.outputs, outputs)}

    def profile(self, *args: Any, **kwargs: Any) -> Any:
        raise ExecutionError("profiling a build that takes its dims at run time is not "
                             "supported; profile a module compiled for static shapes")


def _empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An aligned, uninitialized array (ember_run writes every output whole)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return aligned_empty(max(nbytes, 1), zeroed=False)[:nbytes].view(dtype).reshape(shape)


__all__ = ["DimsBinding", "DimsResolver", "RuntimeDimsModel"]
