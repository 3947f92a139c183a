"""Classical machine-learning ops of the ``ai.onnx.ml`` domain: ArrayFeatureExtractor,
Binarizer, LabelEncoder and TreeEnsemble.

Their ember names carry the domain (``ai.onnx.ml.TreeEnsemble``), as the ONNX frontend names
ops of other domains.  Where the specification leaves a detail open, ONNX Runtime's behaviour
is followed (ArrayFeatureExtractor on a 1-D input returns one row; a TreeEnsemble target that
no leaf reaches is 0 under MIN/MAX aggregation; PROBIT uses the same inverse-erf
approximation).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ember.core.dims import Dim, dim_product
from ember.core.dtypes import DType
from ember.ir.types import TensorType, ValueType
from ember.ops.registry import REQUIRED, Attr, InferContext, RefContext, op
from ember.ops.shape_infer import same_as_input, tensor_input

ML = "ai.onnx.ml."

# ------------------------------------------------------------------- ArrayFeatureExtractor


def _infer_array_feature_extractor(ctx: InferContext) -> list[ValueType | None]:
    x, indices = tensor_input(ctx, 0), tensor_input(ctx, 1)
    if indices.dtype != DType.INT64:
        raise ctx.error(f"the indices (input 1) must be int64, got {indices}")
    count: Dim = dim_product(indices.shape) if indices.shape is not None else None
    if x.shape is None:
        return [TensorType(x.dtype, None)]
    if len(x.shape) <= 1:
        return [TensorType(x.dtype, (1, count))]
    return [TensorType(x.dtype, x.shape[:-1] + (count,))]


@op(ML + "ArrayFeatureExtractor", family="ml", infer=_infer_array_feature_extractor)
def array_feature_extractor(ctx, x, indices):
    """Select the entries ``indices`` of the last axis of ``x`` (a 1-D ``x`` gives one row)."""
    flat = np.asarray(indices, dtype=np.int64).reshape(-1)
    size = x.shape[-1] if x.ndim else 1
    if np.any((flat < 0) | (flat >= size)):
        raise ctx.error(f"indices {flat.tolist()} are out of range for a last axis of "
                        f"size {size}")
    selected = np.take(x.reshape(1, -1) if x.ndim <= 1 else x, flat, axis=-1)
    return selected


# ----------------------------------------------------------------------------- Binarizer


@op(ML + "Binarizer", family="ml", infer=same_as_input(0),
    attrs={"threshold": Attr.float(0.0)})
def binarizer(ctx, x, *, threshold):
    """1 where x > threshold, else 0, in x's dtype."""
    return (x > threshold).astype(x.dtype)


# ----------------------------------------------------------------------------- LabelEncoder

_KEY_ATTRS = ("keys_floats", "keys_int64s", "keys_strings", "keys_tensor")
_VALUE_ATTRS = ("values_floats", "values_int64s", "values_strings", "values_tensor")
# values attribute -> (element type, the default_* attribute used when no default_tensor)
_VALUE_KINDS = {
    "values_floats": (DType.FLOAT32, "default_float"),
    "values_int64s": (DType.INT64, "default_int64"),
    "values_strings": (DType.STRING, "default_string"),
}


Context = InferContext | RefContext


def _chosen(ctx: Context, attrs: dict[str, Any], names: Sequence[str], what: str) -> str:
    """The one attribute of ``names`` that is set."""
    present = [name for name in names if attrs.get(name) is not None]
    if len(present) != 1:
        raise ctx.error(f"exactly one of {list(names)} must be set ({what}), got "
                        f"{present or 'none'}")
    return present[0]


def _values_dtype(ctx: Context, attrs: dict[str, Any]) -> DType:
    name = _chosen(ctx, attrs, _VALUE_ATTRS, "the values")
    if name == "values_tensor":
        return DType.from_numpy(np.asarray(attrs[name]).dtype)
    return _VALUE_KINDS[name][0]


def _infer_label_encoder(ctx: InferContext) -> list[ValueType | None]:
    x = tensor_input(ctx, 0)
    _chosen(ctx, ctx.attrs, _KEY_ATTRS, "the keys")
    return [TensorType(_values_dtype(ctx, ctx.attrs), x.shape)]


def _label_default(attrs: dict[str, Any], values_attr: str, dtype: DType) -> Any:
    if attrs["default_tensor"] is not None:
        return np.asarray(attrs["default_tensor"]).reshape(-1)[0]
    if values_attr != "values_tensor":
        return attrs[_VALUE_KINDS[values_attr][1]]
    if dtype == DType.STRING:
        return "_Unused"
    return -1 if dtype.is_int else -0.0


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


@op(ML + "LabelEncoder", family="ml", infer=_infer_label_encoder,
    attrs={
        "default_float": Attr.float(-0.0),
        "default_int64": Attr.int(-1),
        "default_string": Attr.string("_Unused"),
        "default_tensor": Attr.tensor(None),
        "keys_floats": Attr.floats(None),
        "keys_int64s": Attr.ints(None),
        "keys_strings": Attr.strings(None),
        "keys_tensor": Attr.tensor(None),
        "values_floats": Attr.floats(None),
        "values_int64s": Attr.ints(None),
        "values_strings": Attr.strings(None),
        "values_tensor": Attr.tensor(None),
    })
def label_encoder(ctx, x, **attrs):
    """Map each element through the keys -> values table (the default where it is absent;
    a NaN key matches any NaN)."""
    keys_attr = _chosen(ctx, attrs, _KEY_ATTRS, "the keys")
    values_attr = _chosen(ctx, attrs, _VALUE_ATTRS, "the values")
    keys = np.asarray(attrs[keys_attr]).reshape(-1).tolist()
    values = np.asarray(attrs[values_attr]).reshape(-1).tolist()
    if len(keys) != len(values):
        raise ctx.error(f"{keys_attr} has {len(keys)} entries but {values_attr} has "
                        f"{len(values)}")
    dtype = _values_dtype(ctx, attrs)
    default = _label_default(attrs, values_attr, dtype)
    table = {}
    nan_value = default
    for key, value in zip(keys, values):  # a repeated key: the last one wins
        if _is_nan(key):
            nan_value = value
        else:
            table[key] = value
    flat = [nan_value if _is_nan(v) else table.get(v, default) for v in x.reshape(-1).tolist()]
    return np.array(flat, dtype=dtype.numpy).reshape(x.shape)


# ----------------------------------------------------------------------------- TreeEnsemble

_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)
_AVERAGE, _SUM, _MIN, _MAX = range(4)
_NONE, _SOFTMAX, _LOGISTIC, _SOFTMAX_ZERO, _PROBIT = range(5)


def _n_targets(attrs: dict[str, Any]) -> int:
    if attrs["n_targets"] is not None:
        return int(attrs["n_targets"])
    return max(attrs["leaf_targetids"], default=-1) + 1


def _infer_tree_ensemble(ctx: InferContext) -> list[ValueType | None]:
    x = tensor_input(ctx, 0)
    if x.shape is not None and len(x.shape) != 2:
        raise ctx.error(f"X must be [N, F], got {x}")
    rows = x.shape[0] if x.shape is not None else None
    return [TensorType(x.dtype, (rows, _n_targets(ctx.attrs)))]


def _member_sets(ctx: RefContext, modes: np.ndarray,
                 membership_values: np.ndarray | None) -> dict[int, np.ndarray]:
    """The set of each BRANCH_MEMBER node, in node order; sets are NaN-terminated runs."""
    members = [int(i) for i in np.flatnonzero(modes == _MEMBER)]
    if not members:
        return {}
    if membership_values is None:
        raise ctx.error("nodes with mode BRANCH_MEMBER need membership_values")
    values = np.asarray(membership_values, dtype=np.float64).reshape(-1)
    ends = np.flatnonzero(np.isnan(values))
    if len(ends) != len(members):
        raise ctx.error(f"membership_values holds {len(ends)} NaN-terminated set(s) for "
                        f"{len(members)} BRANCH_MEMBER node(s)")
    starts = np.concatenate([[0], ends[:-1] + 1])
    return {node: values[start:end] for node, start, end in zip(members, starts, ends)}


def _node_decisions(ctx: RefContext, x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """[N, nodes] booleans: does sample n take the true branch at node k."""
    modes = np.asarray(attrs["nodes_modes"]).reshape(-1).astype(np.int64)
    features = np.asarray(attrs["nodes_featureids"], dtype=np.int64)
    splits = np.asarray(attrs["nodes_splits"], dtype=np.float64).reshape(-1)
    if np.any((features < 0) | (features >= x.shape[1])):
        raise ctx.error(f"nodes_featureids reach past the {x.shape[1]} features of X")
    values = x[:, features].astype(np.float64)
    comparisons = {
        _LEQ: values <= splits, _LT: values < splits, _GTE: values >= splits,
        _GT: values > splits, _EQ: values == splits, _NEQ: values != splits,
    }
    decisions = np.zeros(values.shape, dtype=bool)
    for mode, result in comparisons.items():
        decisions[:, modes == mode] = result[:, modes == mode]
    for node, members in _member_sets(ctx, modes, attrs["membership_values"]).items():
        decisions[:, node] = np.isin(values[:, node], members)
    unknown = set(np.unique(modes).tolist()) - set(range(7))
    if unknown:
        raise ctx.error(f"unknown nodes_modes {sorted(unknown)} (0..6 are defined)")
    tracks_true = attrs["nodes_missing_value_tracks_true"]
    if tracks_true is not None:
        missing = np.isnan(values) & np.asarray(tracks_true, dtype=bool)
        decisions |= missing
    return decisions


def _leaves_reached(ctx: RefContext, decisions: np.ndarray, root: int,
                    attrs: dict[str, Any]) -> np.ndarray:
    """For every sample, the index of the leaf its walk from ``root`` ends in."""
    true_ids = np.asarray(attrs["nodes_truenodeids"], dtype=np.int64)
    false_ids = np.asarray(attrs["nodes_falsenodeids"], dtype=np.int64)
    true_leaf = np.asarray(attrs["nodes_trueleafs"], dtype=bool)
    false_leaf = np.asarray(attrs["nodes_falseleafs"], dtype=bool)
    rows = np.arange(decisions.shape[0])
    current = np.full(len(rows), root, dtype=np.int64)
    at_leaf = np.zeros(len(rows), dtype=bool)
    for _ in range(decisions.shape[1] + 1):
        if at_leaf.all():
            return current
        walking = ~at_leaf
        node = current[walking]
        go_true = decisions[rows[walking], node]
        current[walking] = np.where(go_true, true_ids[node], false_ids[node])
        at_leaf[walking] = np.where(go_true, true_leaf[node], false_leaf[node])
    raise ctx.error(f"the tree rooted at node {root} has a cycle")


def _post_transform(ctx: RefContext, scores: np.ndarray, kind: int) -> np.ndarray:
    if kind == _NONE:
        return scores
    if kind == _LOGISTIC:
        return 1.0 / (1.0 + np.exp(-scores))
    if kind == _SOFTMAX:
        shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
        return shifted / shifted.sum(axis=1, keepdims=True)
    if kind == _SOFTMAX_ZERO:  # a zero score stays zero
        nonzero = scores != 0
        top = np.where(nonzero, scores, -np.inf).max(axis=1, keepdims=True)
        shifted = np.where(nonzero, np.exp(scores - np.where(np.isfinite(top), top, 0)), 0)
        total = shifted.sum(axis=1, keepdims=True)
        return np.divide(shifted, total, out=np.zeros_like(shifted), where=total > 0)
    if kind == _PROBIT:
        return np.sqrt(2.0) * _erfinv(2.0 * scores - 1.0)
    raise ctx.error(f"post_transform must be in 0..4, got {kind}")


def _erfinv(x: np.ndarray) -> np.ndarray:
    """Winitzki's approximation of the inverse error function (as ONNX Runtime computes it)."""
    a = 0.147
    log_term = np.log((1.0 - x) * (1.0 + x))
    first = 2.0 / (np.pi * a) + 0.5 * log_term
    return np.sign(x) * np.sqrt(-first + np.sqrt(first * first - log_term / a))


@op(ML + "TreeEnsemble", family="ml", infer=_infer_tree_ensemble,
    attrs={
        "aggregate_function": Attr.int(_SUM),
        "leaf_targetids": Attr.ints(REQUIRED),
        "leaf_weights": Attr.tensor(REQUIRED),
        "membership_values": Attr.tensor(None),
        "n_targets": Attr.int(None),
        "nodes_falseleafs": Attr.ints(REQUIRED),
        "nodes_falsenodeids": Attr.ints(REQUIRED),
        "nodes_featureids": Attr.ints(REQUIRED),
        "nodes_hitrates": Attr.tensor(None),
        "nodes_missing_value_tracks_true": Attr.ints(None),
        "nodes_modes": Attr.tensor(REQUIRED),
        "nodes_splits": Attr.tensor(REQUIRED),
        "nodes_trueleafs": Attr.ints(REQUIRED),
        "nodes_truenodeids": Attr.ints(REQUIRED),
        "post_transform": Attr.int(_NONE),
        "tree_roots": Attr.ints(REQUIRED),
    })
def tree_ensemble(ctx, x, **attrs):
    """Sum (or average/min/max) per target the leaf weights each tree routes a sample to,
    then apply post_transform."""
    if x.ndim != 2:
        raise ctx.error(f"X must be [N, F], got shape {x.shape}")
    n_targets = _n_targets(attrs)
    weights = np.asarray(attrs["leaf_weights"], dtype=np.float64).reshape(-1)
    targets = np.asarray(attrs["leaf_targetids"], dtype=np.int64)
    if len(weights) != len(targets):
        raise ctx.error(f"leaf_weights has {len(weights)} entries, leaf_targetids "
                        f"{len(targets)}")
    if np.any((targets < 0) | (targets >= n_targets)):
        raise ctx.error(f"leaf_targetids must be in [0, {n_targets})")
    decisions = _node_decisions(ctx, x, attrs)
    rows = np.arange(x.shape[0])
    aggregate = attrs["aggregate_function"]
    if aggregate not in (_AVERAGE, _SUM, _MIN, _MAX):
        raise ctx.error(f"aggregate_function must be in 0..3, got {aggregate}")
    start = {_MIN: np.inf, _MAX: -np.inf}.get(aggregate, 0.0)
    scores = np.full((x.shape[0], n_targets), start)
    reached = np.zeros(scores.shape, dtype=bool)
    for root in attrs["tree_roots"]:
        leaves = _leaves_reached(ctx, decisions, root, attrs)
        index = (rows, targets[leaves])
        reached[index] = True
        if aggregate == _MIN:
            np.minimum.at(scores, index, weights[leaves])
        elif aggregate == _MAX:
            np.maximum.at(scores, index, weights[leaves])
        else:
            np.add.at(scores, index, weights[leaves])
    if aggregate == _AVERAGE:
        scores /= max(len(attrs["tree_roots"]), 1)
    scores[~reached] = 0.0  # a target no leaf reached
    return _post_transform(ctx, scores, attrs["post_transform"]).astype(x.dtype)
