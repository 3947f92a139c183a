"""Matrix products: MatMul (numpy semantics: batched, 1-D operands promoted), Gemm, Einsum,
Det, and the quantized MatMulInteger and QLinearMatMul.

16-bit floats are multiplied in float32 and rounded once at the end; integer products stay in
their own type (wrapping on overflow, as ONNX leaves it to the implementation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ember.core.dims import Dim
from ember.core.dtypes import DType
from ember.core.errors import ShapeError
from ember.ir.types import TensorType, ValueType
from ember.ops.conv import compute_dtype, optional_tensor
from ember.ops.quant import requantize, widen
from ember.ops.registry import REQUIRED, Attr, InferContext, RefContext, op
from ember.ops.shape_infer import broadcast_shapes

Context = InferContext | RefContext

# ----------------------------------------------------------------------------- shape helpers


def _check_same_dim(ctx: InferContext, a: Dim, b: Dim, what: str) -> None:
    """Two dims that must agree: an error when both are known and differ."""
    if isinstance(a, int) and isinstance(b, int) and a != b:
        raise ctx.error(f"{what}: {a} != {b}")


def matmul_shape(ctx: InferContext, a: tuple[Dim, ...] | None,
                 b: tuple[Dim, ...] | None) -> tuple[Dim, ...] | None:
    """Shape of ``a @ b`` under numpy's matmul rules (1-D operands promoted, then dropped)."""
    if a is None or b is None:
        return None
    if not a or not b:
        raise ctx.error("MatMul operands must have rank >= 1, got a scalar")
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    _check_same_dim(ctx, a2[-1], b2[-2], f"inner dimensions differ ({list(a)} @ {list(b)})")
    try:
        batch = broadcast_shapes([a2[:-2], b2[:-2]])
    except ShapeError as error:
        raise ctx.error(f"batch dimensions do not broadcast: {error}") from None
    shape = tuple(batch) + (a2[-2], b2[-1])
    if len(b) == 1:
        shape = shape[:-1]
    if len(a) == 1:
        shape = shape[:-2] + shape[-1:] if len(b) != 1 else shape[:-1]
    return shape


def _product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` accumulated in float32 for 16-bit floats, in the operands' type otherwise."""
    acc = compute_dtype(a.dtype)
    return np.matmul(a.astype(acc, copy=False), b.astype(acc, copy=False))


# ----------------------------------------------------------------------------- MatMul


def _matmul_type(ctx: InferContext) -> list[ValueType | None]:
    a, b = optional_tensor(ctx, 0), optional_tensor(ctx, 1)
    if a is None or b is None:
        return [None]
    if a.dtype != b.dtype:
        raise ctx.error(f"operands must have one type, got {a.dtype} and {b.dtype}")
    return [TensorType(a.dtype, matmul_shape(ctx, a.shape, b.shape))]


@op("MatMul", family="matmul", infer=_matmul_type)
def matmul(ctx, a, b):
    """Matrix product with numpy semantics: batch dims broadcast, 1-D operands promoted."""
    _check_matmul_operands(ctx, a, b)
    return _product(a, b).astype(a.dtype, copy=False)


def _check_matmul_operands(ctx: RefContext, a: np.ndarray, b: np.ndarray) -> None:
    if a.ndim == 0 or b.ndim == 0:
        raise ctx.error("MatMul operands must have rank >= 1, got a scalar")
    inner_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if a.shape[-1] != inner_b:
        raise ctx.error(f"inner dimensions differ: {a.shape} @ {b.shape}")


# ----------------------------------------------------------------------------- Gemm


def _gemm_type(ctx: InferContext) -> list[ValueType | None]:
    a, b = optional_tensor(ctx, 0), optional_tensor(ctx, 1)
    if a is None or b is None:
        return [None]
    if a.dtype != b.dtype:
        raise ctx.error(f"A and B must have one type, got {a.dtype} and {b.dtype}")
    m = k_a = k_b = n = None
    for t, name in ((a, "A"), (b, "B")):
        if t.shape is not None and len(t.shape) != 2:
            raise ctx.error(f"{name} must be 2-D, got {t}")
    if a.shape is not None:
        m, k_a = a.shape[::-1] if ctx.attrs["transA"] else a.shape
    if b.shape is not None:
        k_b, n = b.shape[::-1] if ctx.attrs["transB"] else b.shape
    _check_same_dim(ctx, k_a, k_b, "inner dimensions of A' and B' differ")
    c = optional_tensor(ctx, 2)
    if c is not None and c.shape is not None:
        _check_unidirectional(ctx, c.shape, (m, n))
    return [TensorType(a.dtype, (m, n))]


def _check_unidirectional(ctx: InferContext, c: Sequence[Dim], target: Sequence[Dim]) -> None:
    if len(c) > 2:
        raise ctx.error(f"C must have rank <= 2 to broadcast to (M, N), got {list(c)}")
    for dim, want in zip(reversed(c), reversed(target)):
        if isinstance(dim, int) and isinstance(want, int) and dim not in (1, want):
            raise ctx.error(f"C of shape {list(c)} does not broadcast to (M, N) = "
                            f"{list(target)}")


@op("Gemm", family="matmul", infer=_gemm_type,
    attrs={"alpha": Attr.float(1.0), "beta": Attr.float(1.0), "transA": Attr.int(0),
           "transB": Attr.int(0)})
def gemm(ctx, a, b, c=None, *, alpha, beta, transA, transB):
    """alpha * A' @ B' + beta * C, A' and B' optionally transposed; C broadcasts to (M, N)."""
    if a.ndim != 2 or b.ndim != 2:
        raise ctx.error(f"A {a.shape} and B {b.shape} must be 2-D")
    a = a.T if transA else a
    b = b.T if transB else b
    if a.shape[1] != b.shape[0]:
        raise ctx.error(f"inner dimensions of A' {a.shape} and B' {b.shape} differ")
    y = _product(a, b)
    if alpha != 1.0:
        y = y * np.asarray(alpha, dtype=y.dtype if y.dtype.kind == "f" else np.float64)
    if c is not None and beta != 0.0:
        if c.ndim > 2 or np.broadcast_shapes(c.shape, y.shape) != y.shape:
            raise ctx.error(f"C {c.shape} does not broadcast to (M, N) = {y.shape}")
        c = c.astype(y.dtype, copy=False)
        y = y + (c if beta == 1.0 else c * np.asarray(beta, dtype=np.result_type(c, 1.0)))
    return y.astype(a.dtype, copy=False)


# ----------------------------------------------------------------------------- Einsum


@dataclass(frozen=True)
class Equation:
    """A parsed einsum equation; ``...`` is kept as the single character ``.``."""

    inputs: tuple[str, ...]
    output: str

    @staticmethod
    def parse(ctx: Context, text: str, n_inputs: int) -> "Equation":
        text = text.replace(" ", "")
        lhs, arrow, rhs = text.partition("->")
        terms = tuple(term.replace("...", ".") for term in lhs.split(","))
        if len(terms) != n_inputs:
            raise ctx.error(f"equation '{text}' has {len(terms)} operand terms for "
                            f"{n_inputs} inputs")
        for term in terms + ((rhs.replace("...", "."),) if arrow else ()):
            stray = [ch for ch in term if not (ch.isascii() and ch.isalpha()) and ch != "."]
            if stray or term.count(".") > 1:
                raise ctx.error(f"equation '{text}': term '{term}' is not letters with at "
                                f"most one '...'")
        if arrow:
            output = rhs.replace("...", ".")
            missing = set(output) - set("".join(terms)) - {"."}
            if missing or len(set(output)) != len(output):
                raise ctx.error(f"equation '{text}': output letters must be distinct and "
                                f"appear in an input")
        else:
            letters = "".join(terms).replace(".", "")
            once = sorted(ch for ch in set(letters) if letters.count(ch) == 1)
            output = ("." if any("." in t for t in terms) else "") + "".join(once)
        return Equation(terms, output)


def _einsum_type(ctx: InferContext) -> list[ValueType | None]:
    operands = [optional_tensor(ctx, i) for i in range(len(ctx.inputs))]
    if not operands or any(t is None for t in operands):
        return [None]
    dtype = operands[0].dtype
    if any(t.dtype != dtype for t in operands):
        raise ctx.error(f"inputs must have one type, got {[str(t.dtype) for t in operands]}")
    eq = Equation.parse(ctx, ctx.attrs["equation"], len(operands))
    letters: dict[str, Dim] = {}
    ellipses: list[tuple[Dim, ...]] = []
    for term, t in zip(eq.inputs, operands):
        if t.shape is None:
            if "." in term:
                ellipses.append(None)  # type: ignore[arg-type]
            continue
        named = len(term) - ("." in term)
        if len(t.shape) < named or ("." not in term and len(t.shape) != named):
            raise ctx.error(f"term '{term}' does not match the rank of input {t}")
        head, _, tail = term.partition(".")
        for ch, dim in zip(head, t.shape):
            letters[ch] = _merge_letter(ctx, ch, letters.get(ch, 1), dim)
        for ch, dim in zip(tail, t.shape[len(t.shape) - len(tail):]):
            letters[ch] = _merge_letter(ctx, ch, letters.get(ch, 1), dim)
        if "." in term:
            ellipses.append(tuple(t.shape[len(head):len(t.shape) - len(tail)]))
    if "." in eq.output and any(e is None for e in ellipses):
        return [TensorType(dtype, None)]
    try:
        broadcast = broadcast_shapes(ellipses) if ellipses else ()
    except ShapeError as error:
        raise ctx.error(f"'...' dimensions do not broadcast: {error}") from None
    shape: list[Dim] = []
    for ch in eq.output:
        if ch == ".":
            shape.extend(broadcast or ())
        else:
            shape.append(letters.get(ch))
    return [TensorType(dtype, tuple(shape))]


def _merge_letter(ctx: InferContext, letter: str, known: Dim, dim: Dim) -> Dim:
    if known == 1:
        return dim
    if dim == 1:
        return known
    if isinstance(known, int) and isinstance(dim, int) and known != dim:
        raise ctx.error(f"index '{letter}' has sizes {known} and {dim}")
    return known if known is not None else dim


@op("Einsum", family="matmul", infer=_einsum_type, attrs={"equation": Attr.string(REQUIRED)},
    inputs=(1, -1))
def einsum(ctx, *operands, equation):
    """Einstein summation over the operands as the equation describes."""
    Equation.parse(ctx, equation, len(operands))
    dtype = operands[0].dtype
    acc = compute_dtype(dtype)
    promoted = [x.astype(acc, copy=False) for x in operands]
    try:
        result = np.einsum(equation.replace(" ", ""), *promoted, optimize=len(operands) > 2)
    except ValueError as error:
        raise ctx.error(f"equation '{equation}' does not fit inputs "
                        f"{[x.shape for x in operands]}: {error}") from None
    return np.asarray(result).astype(dtype, copy=False)


# ----------------------------------------------------------------------------- Det


def _det_type(ctx: InferContext) -> list[ValueType | None]:
    x = optional_tensor(ctx, 0)
    if x is None:
        return [None]
    if x.shape is None:
        return [TensorType(x.dtype, None)]
    if len(x.shape) < 2:
        raise ctx.error(f"input must have rank >= 2 (..., M, M), got {x}")
    _check_same_dim(ctx, x.shape[-2], x.shape[-1], "the matrices are not square")
    return [TensorType(x.dtype, tuple(x.shape[:-2]))]


@op("Det", family="matmul", infer=_det_type)
def det(ctx, x):
    """Determinant of each square matrix in the last two axes."""
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ctx.error(f"input must be (..., M, M), got shape {x.shape}")
    work = x if x.dtype.kind == "f" and x.dtype.itemsize >= 4 else x.astype(np.float64)
    return np.asarray(np.linalg.det(work)).astype(x.dtype)


# ----------------------------------------------------------------------------- quantized


def _row_param(param: np.ndarray | None, a: np.ndarray) -> np.ndarray | None:
    """A per-row parameter of ``a`` (one value per row, i.e. per dim -2) as a column."""
    if param is None:
        return None
    param = np.asarray(param)
    if param.ndim == 1 and param.size > 1 and a.ndim >= 2 and param.size == a.shape[-2]:
        return param.reshape(-1, 1)
    return param


def _quantized_product(ctx: RefContext, a: np.ndarray, a_zero_point: np.ndarray | None,
                       b: np.ndarray, b_zero_point: np.ndarray | None) -> np.ndarray:
    """(a - a_zero_point) @ (b - b_zero_point), exact (int32, or float32 for float8)."""
    _check_matmul_operands(ctx, a, b)
    a_zero_point = _row_param(a_zero_point, a)
    a_shift, b_shift = widen(a), widen(b)
    try:
        if a_zero_point is not None:
            a_shift = a_shift - widen(a_zero_point)
        if b_zero_point is not None:
            b_shift = b_shift - widen(np.asarray(b_zero_point))
        return np.matmul(a_shift, b_shift)
    except ValueError:
        raise ctx.error(f"zero points {np.shape(a_zero_point)} and {np.shape(b_zero_point)} "
                        f"do not fit A {a.shape} and B {b.shape} (scalar, per row of A or "
                        f"per column of B)") from None


def _matmul_integer_type(ctx: InferContext) -> list[ValueType | None]:
    a, b = optional_tensor(ctx, 0), optional_tensor(ctx, 1)
    if a is None or b is None:
        return [None]
    return [TensorType(DType.INT32, matmul_shape(ctx, a.shape, b.shape))]


@op("MatMulInteger", family="matmul", infer=_matmul_integer_type)
def matmul_integer(ctx, a, b, a_zero_point=None, b_zero_point=None):
    """(A - a_zero_point) @ (B - b_zero_point) accumulated in int32."""
    return _quantized_product(ctx, a, a_zero_point, b, b_zero_point).astype(np.int32)


def _qlinear_matmul_type(ctx: InferContext) -> list[ValueType | None]:
    a, b, y_zero_point = optional_tensor(ctx, 0), optional_tensor(ctx, 3), optional_tensor(ctx, 7)
    if a is None or b is None:
        return [None]
    dtype = y_zero_point.dtype if y_zero_point is not None else a.dtype
    return [TensorType(dtype, matmul_shape(ctx, a.shape, b.shape))]


@op("QLinearMatMul", family="matmul", infer=_qlinear_matmul_type)
def qlinear_matmul(ctx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                   y_zero_point):
    """Quantized matmul: exact product of zero-point-corrected inputs, requantized to y."""
    acc = _quantized_product(ctx, a, a_zero_point, b, b_zero_point)
    multiplier = _row_param(a_scale, a) * np.asarray(b_scale) / np.asarray(y_scale)
    return requantize(acc, multiplier, y_zero_point, y_zero_point.dtype)
