"""Run-time inputs for a mutated model: the seed's inputs, conformed to what the mutant
declares; and the transforms of the ``inputs`` kind (odd layouts, wrong signatures, odd
values) that test the run-time input checks.

ember and the oracle must see the same inputs, and those inputs should fit the mutant where
it is still sensible (an input renamed, re-typed or given another static shape gets inputs of
the new name, type and shape); where the declaration is hostile (negative, huge or symbolic
dims, undefined types) the seed's own input is used, so ember's handling of the declaration
itself is what the case tests.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

MAX_ELEMENTS = 1 << 20
MAX_DIM = 4096


def runtime_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that need a feed (an input with an initializer is a weight)."""
    weights = {t.name for t in graph.initializer} | {s.values.name
                                                     for s in graph.sparse_initializer}
    return [vi for vi in graph.input if vi.name not in weights]


def build_feeds(model: onnx.ModelProto, seed_feeds: dict[str, np.ndarray],
                overrides: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One array per run-time input of ``model``: an override, else the seed's input of the
    same name (or position) conformed to the declared type."""
    seed_list = list(seed_feeds.values())
    feeds: dict[str, np.ndarray] = {}
    for position, vi in enumerate(runtime_inputs(model.graph)):
        if vi.name in overrides:
            feeds[vi.name] = overrides[vi.name]
            continue
        base = seed_feeds.get(vi.name)
        if base is None and position < len(seed_list):
            base = seed_list[position]
        feeds[vi.name] = _conform(base, vi.type, position)
    return feeds


def _conform(base: np.ndarray | None, vtype: onnx.TypeProto, position: int) -> np.ndarray:
    if vtype.WhichOneof("value") != "tensor_type":
        return base if base is not None else np.zeros((1,), np.float32)
    tensor_type = vtype.tensor_type
    dtype = _numpy_dtype(tensor_type.elem_type, base)
    shape = _shape(tensor_type, base)
    if base is not None and tuple(base.shape) == shape:
        return _cast(base, dtype)
    generator = np.random.default_rng(1000 + position)
    if dtype.kind == "f" or dtype.name in ("bfloat16",) or dtype.name.startswith("float"):
        return generator.standard_normal(shape).astype(dtype)
    return _cast(generator.standard_normal(shape), dtype)


def _numpy_dtype(elem_type: int, base: np.ndarray | None) -> np.dtype:
    fallback = base.dtype if base is not None else np.dtype(np.float32)
    if elem_type not in TensorProto.DataType.values() or elem_type == TensorProto.UNDEFINED:
        return fallback
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return fallback


def _shape(tensor_type: onnx.TypeProto.Tensor, base: np.ndarray | None) -> tuple[int, ...]:
    base_shape = tuple(base.shape) if base is not None else ()
    if not tensor_type.HasField("shape"):
        return base_shape
    dims = list(tensor_type.shape.dim)
    shape = []
    for i, dim in enumerate(dims):
        seed_dim = base_shape[i] if len(base_shape) == len(dims) else None
        if dim.HasField("dim_value") and 0 <= dim.dim_value <= MAX_DIM:
            shape.append(int(dim.dim_value))
        elif seed_dim is not None:
            shape.append(seed_dim)
        else:
            shape.append(1 if dim.HasField("dim_value") else 2)
    if int(np.prod(shape, dtype=np.float64)) > MAX_ELEMENTS:
        return base_shape
    return tuple(shape)


def _cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype == np.bool_:
        return np.asarray(values) > 0
    if dtype.kind in "OUS":
        return np.asarray(values).astype(str).astype(object)
    if dtype.kind in "iu":
        return np.clip(np.rint(np.asarray(values, dtype=np.float64)), 0, 3).astype(dtype)
    return np.asarray(values).astype(dtype)


# ---------------------------------------------------------------------------- transforms

# Layout changes: the same values, so the result must not change at all.
LAYOUT_TRANSFORMS = ("fortran-order", "strided-view", "read-only", "misaligned")
# A signature the model does not have: ember must refuse with an error (or compute the
# same as the oracle, if it chooses to accept).
SIGNATURE_TRANSFORMS = ("dtype-float64", "dtype-float16", "dtype-int64", "dtype-bool",
                        "dtype-object", "dtype-complex64", "shape-extra-dim", "shape-flattened",
                        "shape-transposed", "shape-empty", "shape-scalar", "python-list", "none",
                        "missing-input", "extra-input", "numpy-scalar", "string-array")
# Unusual values of the right type: the result must match the oracle.
VALUE_TRANSFORMS = ("values-nan", "values-inf", "values-huge", "values-denormal",
                    "values-negative-zero")


def transform_feeds(feeds: dict[str, np.ndarray], transform: str) -> dict[str, object]:
    """``feeds`` with its first input changed by ``transform`` (applied in the worker:
    pickling would turn a read-only or misaligned array back into an ordinary one)."""
    if not transform or not feeds:
        return feeds
    result: dict[str, object] = dict(feeds)
    name = next(iter(feeds))
    array = np.asarray(feeds[name])
    if transform == "missing-input":
        del result[name]
    elif transform == "extra-input":
        result["fuzz_extra_input"] = array
    elif transform in LAYOUT_TRANSFORMS:
        result[name] = _relayout(array, transform)
    elif transform in VALUE_TRANSFORMS:
        result[name] = _revalue(array, transform)
    else:
        result[name] = _resignature(array, transform)
    return result


def _relayout(array: np.ndarray, transform: str) -> np.ndarray:
    if transform == "fortran-order":
        return np.asfortranarray(array)
    if transform == "strided-view":
        wide = np.zeros(array.shape + (2,), array.dtype)
        wide[..., 0] = array
        return wide[..., 0]
    if transform == "read-only":
        copy = array.copy()
        copy.setflags(write=False)
        return copy
    buffer = np.zeros(array.nbytes + 1, np.uint8)  # misaligned: one byte past an allocation
    view = buffer[1:].view(array.dtype).reshape(array.shape)
    view[...] = array
    return view


def _revalue(array: np.ndarray, transform: str) -> np.ndarray:
    copy = array.copy()
    if copy.dtype.kind != "f" or copy.size == 0:
        return copy
    value = {"values-nan": np.nan, "values-inf": np.inf, "values-huge": 3e38,
             "values-denormal": 1e-45, "values-negative-zero": -0.0}[transform]
    copy.reshape(-1)[:: max(1, copy.size // 3)] = value
    return copy


def _resignature(array: np.ndarray, transform: str) -> object:
    if transform.startswith("dtype-"):
        return array.astype(transform.removeprefix("dtype-"))
    return {
        "shape-extra-dim": lambda: array[None],
        "shape-flattened": lambda: array.reshape(-1),
        "shape-transposed": lambda: array.T if array.ndim >= 2 else array[None],
        "shape-empty": lambda: np.zeros((0,) + array.shape[1:], array.dtype),
        "shape-scalar": lambda: np.asarray(array.reshape(-1)[0]),
        "python-list": lambda: array.tolist(),
        "none": lambda: None,
        "numpy-scalar": lambda: array.reshape(-1)[0],
        "string-array": lambda: array.astype(str),
    }[transform]()
