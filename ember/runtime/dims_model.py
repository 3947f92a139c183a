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
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ember.runtime.binding import as_array, check_array
from ember.runtime.dtypes import numpy_dtype
from ember.runtime.errors import ExecutionError
from ember.runtime import model as runtime_model
from ember.runtime.model import CompiledModel, _aligned_like, _caller_outputs


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
        self._input_slots = self._input_pointers()

    @property
    def supports_profiling(self) -> bool:
        return False

    def _execute(self, values: Sequence[Any], out: Sequence[Any] | None = None
                 ) -> list[np.ndarray]:
        arrays = {}
        for spec, value in zip(self.inputs, values):
            arrays[spec.name] = as_array(spec.name, value, spec.describe())
        binding = self._resolver({name: tuple(a.shape) for name, a in arrays.items()})
        inputs = []
        for spec in self.inputs:
            array = arrays[spec.name]
            check_array(spec.name, array, numpy_dtype(spec.dtype), tuple(array.shape))
            inputs.append(_aligned_like(np.ascontiguousarray(array), self._input_alignment))
        dims = np.array(binding.dims, dtype=np.int64)
        addresses = [a.ctypes.data for a in inputs]
        layouts = [(_nbytes(shape, dtype), dtype, shape) for dtype, shape in
                   zip((numpy_dtype(spec.dtype) for spec in self.outputs), binding.outputs)]
        if out is None:
            outputs = [runtime_model._output_buffer(*layout) for layout in layouts]
            results, out_addresses, copies = [a for a, _ in outputs], [a for _, a in outputs], []
        else:
            results, out_addresses, copies = _caller_outputs(
                self._output_names, layouts, out, addresses, [a.nbytes for a in inputs])
        self._call(self._run_entry, [*addresses, dims.ctypes.data], out_addresses,
                   workspace_size=binding.workspace_size)
        for target, scratch in copies:
            np.copyto(target, scratch)
        return results

    def profile(self, *args: Any, **kwargs: Any) -> Any:
        raise ExecutionError("profiling a build that takes its dims at run time is not "
                             "supported; profile a module compiled for static shapes")


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


__all__ = ["DimsBinding", "DimsResolver", "RuntimeDimsModel"]
