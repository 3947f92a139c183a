"""What an ATen converter works with: the ember graph being built and the FX values in it.

A converter (``table.py``) turns one FX node of an ATen-level graph into ember nodes.  It reads
its arguments through an :class:`ImportContext`, which knows the ember value that each FX node
became, the type PyTorch recorded for it (``node.meta["val"]``: a FakeTensor, a SymInt, ...),
and offers the few idioms every converter needs: a Python scalar as a constant of the right
element type, an int list (whose items may be symbolic sizes) as a 1-D int64 tensor, a cast to
the dtype PyTorch's type promotion chose.

Symbolic sizes (SymInt) are ember values too: 0-d int64 tensors computed from ``Shape`` of an
input.  Shape specialization folds them to constants, so a graph traced with dynamic sizes
compiles into static kernels for every shape it is called with.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.fx

from ember.core.dtypes import DType
from ember.ir.graph import Graph, Node

INT64_MAX = 2**63 - 1

_TORCH_TO_DTYPE = {
    torch.float32: DType.FLOAT32,
    torch.float64: DType.FLOAT64,
    torch.float16: DType.FLOAT16,
    torch.bfloat16: DType.BFLOAT16,
    torch.int8: DType.INT8,
    torch.int16: DType.INT16,
    torch.int32: DType.INT32,
    torch.int64: DType.INT64,
    torch.uint8: DType.UINT8,
    torch.uint16: DType.UINT16,
    torch.uint32: DType.UINT32,
    torch.uint64: DType.UINT64,
    torch.bool: DType.BOOL,
}


class Unsupported(Exception):
    """A converter declines this node (an argument it does not cover); the reason is shown to
    the user and the node runs in PyTorch instead."""


def ember_dtype(dtype: torch.dtype) -> DType:
    """The ember element type of a torch dtype, or Unsupported (complex, float8, ...)."""
    try:
        return _TORCH_TO_DTYPE[dtype]
    except KeyError:
        raise Unsupported(f"element type {dtype} is not supported") from None


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy copy of a (CPU or fake-free) tensor, bfloat16 included (as ml_dtypes)."""
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    ember_dtype(tensor.dtype)
    return tensor.numpy().copy()


def meta_value(arg: Any) -> Any:
    """What PyTorch recorded for ``arg``: a FakeTensor, a SymInt, a tuple of them; a Python
    value stays itself."""
    if isinstance(arg, torch.fx.Node):
        if "val" not in arg.meta:
            raise Unsupported(f"value '{arg.name}' has no recorded type (meta['val'])")
        return arg.meta["val"]
    return arg


def is_tensor_arg(arg: Any) -> bool:
    return isinstance(arg, torch.fx.Node) and isinstance(arg.meta.get("val"), torch.Tensor)


class ImportContext:
    """The ember graph under construction and the value each FX node became."""

    def __init__(self, graph: Graph):
        self.graph = graph
        # FX node -> ember value name (a tensor, or a 0-d int64 for a SymInt); tuple-valued
        # nodes map to a list of names (None where an output is not produced).
        self.values: dict[torch.fx.Node, Any] = {}
        self.current: torch.fx.Node | None = None
        # size symbol -> the name the user gave it (torch.export's Dim names)
        self.symbol_names: dict[str, str] = {}
        # size symbol -> (ember value, axis) whose size it is
        self.symbol_sources: dict[str, tuple[str, int]] = {}

    # ------------------------------------------------------------------ building
    def add(self, op: str, inputs: Sequence[str], outputs: int = 1, **attrs: Any
            ) -> Any:
        """Append an ember node; returns its output name (or list of names)."""
        hint = self.current.name if self.current is not None else op.lower()
        # fresh_name draws from one counter, so names made before the node is appended
        # cannot collide with each other.
        names = [self.graph.fresh_name(hint) for _ in range(outputs)]
        node = Node(op, list(inputs), names, attrs={k: v for k, v in attrs.items()
                                                    if v is not None}, name=hint)
        self.graph.nodes.append(node)
        return names[0] if outputs == 1 else names

    def constant(self, array: Any, dtype: DType | None = None, hint: str = "c") -> str:
        array = np.asarray(array)
        if dtype is not None:
            array = array.astype(dtype.numpy)
        return self.graph.add_constant(array, hint=hint)

    def scalar(self, value: Any, dtype: DType) -> str:
        """A 0-d tensor of ``dtype``: a Python number as a constant, a SymInt/SymFloat node
        cast to it."""
        if isinstance(value, torch.fx.Node):
            return self.cast(self.symint(value), dtype)
        if isinstance(value, bool) or dtype == DType.BOOL:
            return self.constant(np.array(bool(value)), hint="c")
        return self.constant(np.array(value, dtype=dtype.numpy), hint="c")

    def cast(self, name: str, dtype: DType, current: DType | None = None) -> str:
        """``name`` as ``dtype`` (unchanged when it already is)."""
        current = current if current is not None else self.dtype_of_value(name)
        if current == dtype:
            return name
        return self.add("Cast", [name], to=dtype.onnx)

    def dtype_of_value(self, name: str) -> DType | None:
        """The element type of an input or constant (node outputs get theirs from shape
        inference, which runs once the whole graph is built: None for those)."""
        vtype = self.graph.types.get(name)
        return vtype.dtype if vtype is not None and hasattr(vtype, "dtype") else None

    # ------------------------------------------------------------------ reading arguments
    def tensor(self, arg: Any) -> str:
        """The ember value of a tensor argument."""
        if not isinstance(arg, torch.fx.Node):
            raise Unsupported(f"expected a tensor argument, got {type(arg).__name__}")
        value = self.values.get(arg)
        if not isinstance(value, str):
            raise Unsupported(f"value '{arg.name}' is not available as a tensor")
        return value

    def tensor_as(self, arg: Any, dtype: DType) -> str:
        """A tensor argument cast to ``dtype``, or a Python/symbolic scalar as a 0-d tensor."""
        if is_tensor_arg(arg):
            return self.cast(self.tensor(arg), dtype, self.torch_dtype(arg))
        return self.scalar(arg, dtype)

    def torch_dtype(self, arg: Any) -> DType:
        value = meta_value(arg)
        if isinstance(value, torch.Tensor):
            return ember_dtype(value.dtype)
        raise Unsupported(f"expected a tensor, got {type(value).__name__}")

    def out_dtype(self, index: int = 0) -> DType:
        """The element type PyTorch recorded for the current node's output ``index``."""
        assert self.current is not None
        value = meta_value(self.current)
        if isinstance(value, (tuple, list)):
            value = value[index]
        if not isinstance(value, torch.Tensor):
            raise Unsupported("the node does not produce a tensor")
        return ember_dtype(value.dtype)

    def shape(self, arg: Any) -> tuple[Any, ...]:
        """The recorded shape of a tensor argument: ints, or SymInts for symbolic sizes."""
        value = meta_value(arg)
        if not isinstance(value, torch.Tensor):
            raise Unsupported(f"expected a tensor, got {type(value).__name__}")
        return tuple(value.shape)

    def rank(self, arg: Any) -> int:
        return len(self.shape(arg))

    def static_shape(self, arg: Any) -> tuple[int, ...]:
        shape = self.shape(arg)
        if not all(isinstance(d, int) for d in shape):
            raise Unsupported("needs a static shape here, the traced shape is symbolic")
        return tuple(int(d) for d in shape)

    # ------------------------------------------------------------------ symbolic ints
    def symint(self, arg: Any) -> str:
        """A size (a Python int or a SymInt node) as a 0-d int64 tensor."""
        if isinstance(arg, torch.fx.Node):
            value = self.values.get(arg)
            if not isinstance(value, str):
                raise Unsupported(f"size '{arg.name}' is not available")
            return self.cast(value, DType.INT64)
        if isinstance(arg, (bool, np.bool_)):
            arg = int(arg)
        if isinstance(arg, (int, np.integer)):
            return self.constant(np.array(int(arg), dtype=np.int64))
        if isinstance(arg, torch.SymInt):
            return self._size_expression(arg.node.expr)
        raise Unsupported(f"expected an integer, got {type(arg).__name__}")

    def _size_expression(self, expr: Any) -> str:
        """A symbolic size as ember ops over the ``Shape`` of the tensors that carry its
        symbols (sums and products of symbols and integers)."""
        if expr.is_Integer:
            return self.constant(np.array(int(expr), dtype=np.int64))
        if expr.is_Symbol:
            source = self.symbol_sources.get(str(expr))
            if source is None:
                raise Unsupported(f"size {expr} is not the size of any tensor here")
            return self.dim_size(*source)
        if expr.is_Add or expr.is_Mul:
            op = "Add" if expr.is_Add else "Mul"
            terms = [self._size_expression(term) for term in expr.args]
            result = terms[0]
            for term in terms[1:]:
                result = self.add(op, [result, term])
            return result
        raise Unsupported(f"size expression {expr}")

    def note_symbols(self, name: str, value: torch.Tensor) -> None:
        """Remember which dims of ember value ``name`` carry which size symbols."""
        for axis, d in enumerate(value.shape):
            if isinstance(d, torch.SymInt) and getattr(d.node.expr, "is_Symbol", False):
                self.symbol_sources.setdefault(str(d.node.expr), (name, axis))

    def ints(self, values: Sequence[Any]) -> str:
        """An int list (items may be SymInt nodes) as a 1-D int64 tensor."""
        values = list(values)
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) or
               isinstance(v, bool) for v in values):
            return self.constant(np.array([int(v) for v in values], dtype=np.int64))
        pieces = []
        for value in values:
            scalar = self.symint(value)
            pieces.append(self.add("Unsqueeze", [scalar, self.constant(np.array([0]))]))
        return self.add("Concat", pieces, axis=0)

    def dim_size(self, name: str, axis: int) -> str:
        """Size ``axis`` of ember value ``name`` as a 0-d int64."""
        shape = self.add("Shape", [name], start=axis, end=axis + 1)
        return self.add("Squeeze", [shape, self.constant(np.array([0]))])


def same_size(a: Any, b: Any) -> bool:
    """Whether two recorded sizes are known equal (ints, or the same symbolic expression),
    without asking PyTorch's shape environment, which would add a guard."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt):
        return str(a.node.expr) == str(b.node.expr)
    return False


def static_int(value: Any, what: str) -> int:
    """An argument that must be a plain int at import time."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, bool):
        return int(value)
    raise Unsupported(f"{what} must be a constant integer, got {type(value).__name__}")


def static_ints(values: Any, what: str) -> list[int]:
    if isinstance(values, (int, np.integer)):
        return [int(values)]
    return [static_int(v, what) for v in values]
