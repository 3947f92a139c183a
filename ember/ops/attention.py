"""Attention: scaled dot-product Attention (with masks, KV cache, GQA, softcap, sliding
windows), RotaryEmbedding and the recurrent LinearAttention.

Attention follows the ONNX function body step by step in the inputs' precision: Q and K are
each scaled by sqrt(scale) before their product, the additive bias (mask, causal frontier,
window, padding) is built in Q's type, softmax runs in ``softmax_precision`` (default: Q's
type) and the probabilities are cast back before the product with V.  Matrix products
accumulate in at least float32 and round to the operands' type, as numpy does for float16.

Inputs are 4-D ``(batch, heads, sequence, head_size)`` or 3-D ``(batch, sequence,
heads * head_size)`` with the head counts given as attributes.
"""

from __future__ import annotations

import numpy as np

from ember.core.dims import Dim, dims_equal, exact_divide
from ember.core.dtypes import DType
from ember.core.errors import EmberError
from ember.ir.types import TensorType, ValueType
from ember.ops.registry import REQUIRED, Attr, InferContext, op
from ember.ops.shape_infer import tensor_input

# ----------------------------------------------------------------------------- helpers


def _split_heads(ctx, x: np.ndarray, heads: int, name: str) -> np.ndarray:
    """(batch, sequence, heads * size) -> (batch, heads, sequence, size)."""
    batch, sequence, hidden = x.shape
    if heads <= 0 or hidden % heads:
        raise ctx.error(f"{name}'s hidden size {hidden} is not a multiple of its {heads} heads")
    return x.reshape(batch, sequence, heads, hidden // heads).transpose(0, 2, 1, 3)


def _merge_heads(x: np.ndarray) -> np.ndarray:
    """(batch, heads, sequence, size) -> (batch, sequence, heads * size)."""
    batch, heads, sequence, size = x.shape
    return x.transpose(0, 2, 1, 3).reshape(batch, sequence, heads * size)


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b rounded to a's type (numpy widens bfloat16 products to float32)."""
    return np.matmul(a, b).astype(a.dtype, copy=False)


def _heads_dim(ctx, hidden: Dim, heads: int | None, name: str) -> Dim:
    """The per-head size of a 3-D input's last dim ``hidden`` split into ``heads`` heads."""
    if hidden is None or heads is None:
        return None
    size = exact_divide(hidden, heads)
    if size is None and isinstance(hidden, int):
        raise ctx.error(f"{name}'s hidden size {hidden} is not a multiple of its {heads} heads")
    return size


def _merge(ctx, dims: list[Dim], what: str) -> Dim:
    """The common value of dims that must agree; the most precise one wins."""
    known = [d for d in dims if d is not None]
    for d in known[1:]:
        if dims_equal(known[0], d) is False:
            raise ctx.error(f"{what} disagree: {known[0]} vs {d}")
    static = [d for d in known if isinstance(d, int)]
    return static[0] if static else (known[0] if known else None)


def _dims(t: TensorType | None, rank: int) -> list[Dim]:
    """The shape of ``t`` as a list of ``rank`` dims (None where unknown)."""
    if t is None or t.shape is None:
        return [None] * rank
    return list(t.shape)


def _float_type(ctx, code: int, name: str) -> np.dtype:
    try:
        dtype = DType.from_onnx(code)
    except EmberError:
        dtype = None
    if dtype not in (DType.FLOAT32, DType.FLOAT16, DType.FLOAT64, DType.BFLOAT16):
        raise ctx.error(f"{name} must be the code of float, float16, double or bfloat16, "
                        f"got {code}")
    return dtype.numpy


# ----------------------------------------------------------------------------- Attention

_ATTENTION_ATTRS = {
    "is_causal": Attr.int(0),
    "kv_num_heads": Attr.int(None),
    "q_num_heads": Attr.int(None),
    "qk_matmul_output_mode": Attr.int(0),
    "scale": Attr.float(None),
    "softcap": Attr.float(0.0),
    "softmax_precision": Attr.int(None),
    "left_window_size": Attr.int(-1),
    "right_window_size": Attr.int(-1),
}


def _check_attention_attrs(ctx, attrs: dict) -> None:
    if attrs["qk_matmul_output_mode"] not in (0, 1, 2, 3):
        raise ctx.error(f"qk_matmul_output_mode must be 0, 1, 2 or 3, got "
                        f"{attrs['qk_matmul_output_mode']}")
    for name in ("left_window_size", "right_window_size"):
        if attrs[name] < -1:
            raise ctx.error(f"{name} must be -1 (unbounded) or >= 0, got {attrs[name]}")
    if attrs["softmax_precision"] is not None:
        _float_type(ctx, attrs["softmax_precision"], "softmax_precision")


def _infer_attention(ctx: InferContext) -> list[ValueType | None]:
    q, k, v = (tensor_input(ctx, i) for i in range(3))
    attrs = ctx.attrs
    _check_attention_attrs(ctx, attrs)
    ranks = {t.rank for t in (q, k, v) if t.rank is not None}
    if len(ranks) > 1 or not ranks <= {3, 4}:
        raise ctx.error(f"Q, K and V must all be 3-D or all 4-D, got {q}, {k} and {v}")
    if ctx.has_input(4) != ctx.has_input(5):
        raise ctx.error("past_key and past_value must be given together")
    if ctx.has_input(4) and ctx.has_input(6):
        raise ctx.error("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    rank = ranks.pop() if ranks else None
    if rank is None:
        return [TensorType(q.dtype, None), TensorType(k.dtype, None),
                TensorType(v.dtype, None), TensorType(q.dtype, None)]
    qd, kd, vd = (_dims(t, rank) for t in (q, k, v))
    batch = _merge(ctx, [qd[0], kd[0], vd[0]], "batch sizes of Q, K and V")
    if rank == 4:
        q_heads, q_len, head = qd[1], qd[2], qd[3]
        kv_heads = _merge(ctx, [kd[1], vd[1]], "head counts of K and V")
        key_head, v_head = kd[3], vd[3]
    else:
        q_heads, kv_heads = attrs["q_num_heads"], attrs["kv_num_heads"]
        if q_heads is None or kv_heads is None:
            raise ctx.error("3-D inputs need the attributes q_num_heads and kv_num_heads")
        q_len = qd[1]
        head = _heads_dim(ctx, qd[2], q_heads, "Q")
        key_head = _heads_dim(ctx, kd[2], kv_heads, "K")
        v_head = _heads_dim(ctx, vd[2], kv_heads, "V")
    kv_len = _merge(ctx, [kd[-2], vd[-2]], "sequence lengths of K and V")
    head = _merge(ctx, [head, key_head], "head sizes of Q and K")
    if isinstance(q_heads, int) and isinstance(kv_heads, int) and \
            (kv_heads <= 0 or q_heads % kv_heads):
        raise ctx.error(f"Q's {q_heads} heads must be a multiple of K/V's {kv_heads} heads")
    total = kv_len
    if ctx.has_input(4):
        past_key = tensor_input(ctx, 4)
        if past_key.rank not in (None, 4):
            raise ctx.error(f"past_key must be 4-D (batch, heads, past, size), got {past_key}")
        past = _dims(past_key, 4)
        total = None if past[2] is None or kv_len is None else past[2] + kv_len
    y_shape = ((batch, q_heads, q_len, v_head) if rank == 4 else
               (batch, q_len, None if q_heads is None or v_head is None else q_heads * v_head))
    return [TensorType(q.dtype, y_shape),
            TensorType(k.dtype, (batch, kv_heads, total, head)),
            TensorType(v.dtype, (batch, kv_heads, total, v_head)),
            TensorType(q.dtype, (batch, q_heads, q_len, total))]


def _masking_bias(ctx, dtype: np.dtype, q_len: int, kv_len: int, batch: int,
                  attn_mask: np.ndarray | None, offset: int | np.ndarray, is_causal: bool,
                  left_window: int, right_window: int,
                  nonpad_kv_seqlen: np.ndarray | None) -> np.ndarray:
    """The additive bias of the attention scores: 0 where a key may be attended, -inf not.

    A float mask adds its values; a boolean mask, the causal frontier (key j <= query i +
    offset), the sliding window and the padding after ``nonpad_kv_seqlen`` add 0 / -inf.
    ``offset`` is the number of valid keys before the query block: a scalar or, for an
    external cache, one per batch.  The result broadcasts to (batch, heads, q_len, kv_len).
    """
    neg_inf = np.asarray(-np.inf, dtype=dtype)
    zero = np.zeros((), dtype=dtype)
    bias = np.zeros((q_len, kv_len), dtype=dtype)
    if attn_mask is not None:
        missing = kv_len - attn_mask.shape[-1]
        if missing < 0:
            raise ctx.error(f"attn_mask's last dimension {attn_mask.shape[-1]} exceeds the "
                            f"total sequence length {kv_len}")
        if missing:  # a short mask hides the remaining keys
            pad = [(0, 0)] * (attn_mask.ndim - 1) + [(0, missing)]
            attn_mask = np.pad(attn_mask, pad, constant_values=attn_mask.dtype.type(
                False if attn_mask.dtype == np.bool_ else -np.inf))
        if attn_mask.dtype == np.bool_:
            attn_mask = np.where(attn_mask, zero, neg_inf)
        try:
            bias = bias + attn_mask
        except ValueError:
            raise ctx.error(f"attn_mask of shape {attn_mask.shape} does not broadcast to "
                            f"(batch, heads, {q_len}, {kv_len})") from None
    # Query i sits at absolute position i + offset; key j is at j.
    offsets = np.asarray(offset).reshape(-1, 1, 1, 1) if np.ndim(offset) else offset
    distance = np.arange(q_len)[:, None] + offsets - np.arange(kv_len)[None, :]
    allowed = np.ones(np.shape(distance), dtype=bool)
    if is_causal:
        allowed &= distance >= 0
    if left_window >= 0:
        allowed &= distance <= left_window
    if right_window >= 0:
        allowed &= -distance <= right_window
    if nonpad_kv_seqlen is not None:
        valid_keys = np.arange(kv_len) < nonpad_kv_seqlen.reshape(batch, 1, 1, 1)
        allowed = allowed & valid_keys
    return bias + np.where(allowed, zero, neg_inf)


def _softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; a row of only -inf gives zeros instead of NaN."""
    row_max = np.max(x, axis=-1, keepdims=True)
    row_max = np.where(np.isneginf(row_max), np.zeros((), dtype=x.dtype), row_max)
    e = np.exp(x - row_max)
    total = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(total == 0, np.ones((), dtype=x.dtype), total)


@op("Attention", family="attention", infer=_infer_attention, outputs=(1, 4),
    attrs=_ATTENTION_ATTRS)
def attention(ctx, q, k, v, attn_mask=None, past_key=None, past_value=None,
              nonpad_kv_seqlen=None, *, is_causal, kv_num_heads, q_num_heads,
              qk_matmul_output_mode, scale, softcap, softmax_precision, left_window_size,
              right_window_size):
    """softmax(Q K^T * scale + bias) V, with masks, KV cache, grouped heads and softcap."""
    _check_attention_attrs(ctx, {"qk_matmul_output_mode": qk_matmul_output_mode,
                                 "left_window_size": left_window_size,
                                 "right_window_size": right_window_size,
                                 "softmax_precision": softmax_precision})
    rank = q.ndim
    if rank not in (3, 4) or k.ndim != rank or v.ndim != rank:
        raise ctx.error(f"Q, K and V must all be 3-D or all 4-D, got shapes {q.shape}, "
                        f"{k.shape} and {v.shape}")
    if rank == 3:
        if q_num_heads is None or kv_num_heads is None:
            raise ctx.error("3-D inputs need the attributes q_num_heads and kv_num_heads")
        q = _split_heads(ctx, q, q_num_heads, "Q")
        k = _split_heads(ctx, k, kv_num_heads, "K")
        v = _split_heads(ctx, v, kv_num_heads, "V")
    batch, q_heads, q_len, head = q.shape
    kv_heads = k.shape[1]
    if k.shape[0] != batch or v.shape[0] != batch or v.shape[1] != kv_heads or \
            k.shape[3] != head or v.shape[2] != k.shape[2]:
        raise ctx.error(f"inconsistent Q, K, V shapes (as batch, heads, sequence, size): "
                        f"{q.shape}, {k.shape}, {v.shape}")
    if rank == 4 and (q_num_heads not in (None, q_heads) or kv_num_heads not in (None, kv_heads)):
        raise ctx.error(f"q_num_heads={q_num_heads} / kv_num_heads={kv_num_heads} contradict "
                        f"the 4-D inputs' {q_heads} / {kv_heads} heads")
    if q_heads % kv_heads:
        raise ctx.error(f"Q's {q_heads} heads must be a multiple of K/V's {kv_heads} heads")
    if (past_key is None) != (past_value is None):
        raise ctx.error("past_key and past_value must be given together")
    offset: int | np.ndarray = 0
    if past_key is not None:
        if nonpad_kv_seqlen is not None:
            raise ctx.error("nonpad_kv_seqlen cannot be combined with past_key/past_value")
        offset = past_key.shape[2] if past_key.ndim == 4 else -1
        if past_key.shape != (batch, kv_heads, offset, head) or \
                past_value.shape != (batch, kv_heads, offset, v.shape[3]):
            raise ctx.error(f"past_key {past_key.shape} and past_value {past_value.shape} must "
                            f"be (batch, kv_heads, past, size) like K {k.shape} and V {v.shape}")
        k = np.concatenate([past_key, k], axis=2)
        v = np.concatenate([past_value, v], axis=2)
    elif nonpad_kv_seqlen is not None:
        if nonpad_kv_seqlen.shape != (batch,):
            raise ctx.error(f"nonpad_kv_seqlen must have shape ({batch},), got "
                            f"{nonpad_kv_seqlen.shape}")
        offset = nonpad_kv_seqlen.astype(np.int64) - q_len
    present_key, present_value = k, v
    kv_len = k.shape[2]

    bias = _masking_bias(ctx, q.dtype, q_len, kv_len, batch, attn_mask, offset,
                         bool(is_causal), left_window_size, right_window_size,
                         nonpad_kv_seqlen)
    groups = q_heads // kv_heads  # grouped-query attention: each K/V head serves `groups`
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)

    factor = 1.0 / np.sqrt(head) if scale is None else scale
    root = q.dtype.type(np.sqrt(factor))
    scores = _matmul(q * root, np.swapaxes(k * root, -1, -2))
    capped = np.tanh(scores / softcap) * softcap if softcap > 0 else scores
    biased = capped + bias
    logits = biased if softmax_precision is None else \
        biased.astype(_float_type(ctx, softmax_precision, "softmax_precision"))
    probs = _softmax(logits)
    fully_masked = np.isneginf(np.max(bias, axis=-1, keepdims=True))
    probs = np.where(fully_masked, np.zeros((), dtype=probs.dtype), probs)
    y = _matmul(probs.astype(q.dtype), v)
    qk_output = (scores, capped, biased, probs)[qk_matmul_output_mode].astype(q.dtype)
    return (_merge_heads(y) if rank == 3 else y), present_key, present_value, qk_output


# ----------------------------------------------------------------------------- RotaryEmbedding


def _infer_rotary(ctx: InferContext) -> list[ValueType | None]:
    x = tensor_input(ctx, 0)
    if x.rank is not None and x.rank not in (3, 4):
        raise ctx.error(f"input must be 3-D or 4-D, got {x}")
    if x.rank == 3 and not ctx.attrs["num_heads"]:
        raise ctx.error("a 3-D input needs the attribute num_heads")
    return [x]


@op("RotaryEmbedding", family="attention", infer=_infer_rotary, attrs={
    "interleaved": Attr.int(0),
    "num_heads": Attr.int(None),
    "rotary_embedding_dim": Attr.int(0),
})
def rotary_embedding(ctx, x, cos_cache, sin_cache, position_ids=None, *, interleaved,
                     num_heads, rotary_embedding_dim):
    """Rotate pairs of features by position-dependent angles (RoPE), halves or interleaved."""
    if x.ndim == 4:  # (batch, heads, sequence, size) -> (batch, sequence, heads, size)
        tokens = x.transpose(0, 2, 1, 3)
    elif x.ndim == 3:
        if not num_heads or x.shape[2] % num_heads:
            raise ctx.error(f"a 3-D input needs num_heads dividing its hidden size "
                            f"{x.shape[2]}, got num_heads={num_heads}")
        tokens = x.reshape(x.shape[0], x.shape[1], num_heads, x.shape[2] // num_heads)
    else:
        raise ctx.error(f"input must be 3-D or 4-D, got shape {x.shape}")
    batch, sequence, _, size = tokens.shape
    rotated = rotary_embedding_dim or size
    if rotated % 2 or rotated > size:
        raise ctx.error(f"rotary_embedding_dim {rotated} must be even and at most the head "
                        f"size {size}")
    if position_ids is not None:
        if position_ids.shape != (batch, sequence):
            raise ctx.error(f"position_ids must have shape ({batch}, {sequence}), got "
                            f"{position_ids.shape}")
        if position_ids.size and (position_ids.min() < 0 or
                                  position_ids.max() >= cos_cache.shape[0]):
            raise ctx.error(f"position_ids exceed the {cos_cache.shape[0]} cached positions")
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
    expected = (batch, sequence, rotated // 2)
    if cos_cache.shape != expected or sin_cache.shape != expected:
        raise ctx.error(f"cos_cache/sin_cache (after position_ids) must have shape {expected}, "
                        f"got {cos_cache.shape} and {sin_cache.shape}")
    cos, sin = cos_cache[:, :, None, :], sin_cache[:, :, None, :]
    part, rest = tokens[..., :rotated], tokens[..., rotated:]
    if interleaved:
        first, second = part[..., 0::2], part[..., 1::2]
    else:
        first, second = part[..., : rotated // 2], part[..., rotated // 2:]
    real = cos * first - sin * second
    imag = sin * first + cos * second
    if interleaved:
        part = np.stack([real, imag], axis=-1).reshape(part.shape)
    else:
        part = np.concatenate([real, imag], axis=-1)
    out = np.concatenate([part, rest], axis=-1).astype(x.dtype)
    return out.transpose(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)


# ----------------------------------------------------------------------------- LinearAttention

_UPDATE_RULES = {  # rule: (decays the state, delta-rule correction)
    "linear": (False, False),
    "gated": (True, False),
    "delta": (False, True),
    "gated_delta": (True, True),
}


def _infer_linear_attention(ctx: InferContext) -> list[ValueType | None]:
    query, key, value = (tensor_input(ctx, i) for i in range(3))
    q_heads, kv_heads = ctx.attrs["q_num_heads"], ctx.attrs["kv_num_heads"]
    _check_linear_attrs(ctx, ctx.attrs, ctx.has_input(4), ctx.has_input(5))
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.rank not in (None, 3):
            raise ctx.error(f"{name} must be 3-D (batch, sequence, heads * size), got {t}")
    qd, kd, vd = (_dims(t, 3) for t in (query, key, value))
    batch = _merge(ctx, [qd[0], kd[0], vd[0]], "batch sizes of query, key and value")
    length = _merge(ctx, [qd[1], kd[1], vd[1]], "sequence lengths of query, key and value")
    key_size = _merge(ctx, [_heads_dim(ctx, qd[2], q_heads, "query"),
                            _heads_dim(ctx, kd[2], kv_heads, "key")],
                      "head sizes of query and key")
    value_size = _heads_dim(ctx, vd[2], kv_heads, "value")
    state_dtype = tensor_input(ctx, 3).dtype if ctx.has_input(3) else query.dtype
    hidden = None if value_size is None else q_heads * value_size
    return [TensorType(query.dtype, (batch, length, hidden)),
            TensorType(state_dtype, (batch, kv_heads, key_size, value_size))]


def _check_linear_attrs(ctx, attrs: dict, has_decay: bool, has_beta: bool) -> None:
    rule = attrs["update_rule"]
    if rule not in _UPDATE_RULES:
        raise ctx.error(f"update_rule must be one of {sorted(_UPDATE_RULES)}, got {rule!r}")
    q_heads, kv_heads = attrs["q_num_heads"], attrs["kv_num_heads"]
    if q_heads <= 0 or kv_heads <= 0 or q_heads % kv_heads:
        raise ctx.error(f"q_num_heads ({q_heads}) must be a positive multiple of kv_num_heads "
                        f"({kv_heads})")
    gated, delta = _UPDATE_RULES[rule]
    if gated != has_decay:
        raise ctx.error(f"update_rule {rule!r} {'needs' if gated else 'takes no'} decay input")
    if delta != has_beta:
        raise ctx.error(f"update_rule {rule!r} {'needs' if delta else 'takes no'} beta input")


def _decay_factors(ctx, decay: np.ndarray, heads: int, key_size: int) -> np.ndarray:
    """exp(decay) per head, as (batch, heads, sequence, key_size or 1)."""
    if decay.ndim != 3 or decay.shape[2] not in (heads * key_size, heads):
        raise ctx.error(f"decay must have shape (batch, sequence, {heads * key_size} or "
                        f"{heads}), got {decay.shape}")
    batch, length, last = decay.shape
    per_head = decay.reshape(batch, length, heads, last // heads).transpose(0, 2, 1, 3)
    return np.exp(per_head.astype(np.float32))


def _update_rates(ctx, beta: np.ndarray, heads: int) -> np.ndarray:
    """beta per head, as (batch, heads or 1, sequence, 1)."""
    if beta.ndim != 3 or beta.shape[2] not in (heads, 1):
        raise ctx.error(f"beta must have shape (batch, sequence, {heads} or 1), got "
                        f"{beta.shape}")
    batch, length, last = beta.shape
    return beta.reshape(batch, length, last, 1).transpose(0, 2, 1, 3).astype(np.float32)


@op("LinearAttention", family="attention", infer=_infer_linear_attention, outputs=(2, 2),
    attrs={
        "chunk_size": Attr.int(64),
        "kv_num_heads": Attr.int(REQUIRED),
        "q_num_heads": Attr.int(REQUIRED),
        "scale": Attr.float(0.0),
        "update_rule": Attr.string("gated_delta"),
    })
def linear_attention(ctx, query, key, value, past_state=None, decay=None, beta=None, *,
                     chunk_size, kv_num_heads, q_num_heads, scale, update_rule):
    """Recurrent linear attention S_t = f(S_{t-1}, k_t, v_t); o_t = scale * q_t^T S_t."""
    attrs = {"update_rule": update_rule, "q_num_heads": q_num_heads,
             "kv_num_heads": kv_num_heads}
    _check_linear_attrs(ctx, attrs, decay is not None, beta is not None)
    gated, delta = _UPDATE_RULES[update_rule]
    if query.ndim != 3 or key.ndim != 3 or value.ndim != 3:
        raise ctx.error("query, key and value must be 3-D (batch, sequence, heads * size)")
    # The recurrence accumulates in float32 (chunk_size is only a tiling hint).
    q = _split_heads(ctx, query, q_num_heads, "query").astype(np.float32)
    k = _split_heads(ctx, key, kv_num_heads, "key").astype(np.float32)
    v = _split_heads(ctx, value, kv_num_heads, "value").astype(np.float32)
    batch, _, length, key_size = q.shape
    value_size = v.shape[-1]
    if k.shape != (batch, kv_num_heads, length, key_size) or v.shape[:3] != k.shape[:3]:
        raise ctx.error(f"query {query.shape}, key {key.shape} and value {value.shape} do not "
                        f"agree on batch, sequence and head sizes")
    state_shape = (batch, kv_num_heads, key_size, value_size)
    if past_state is not None and past_state.shape != state_shape:
        raise ctx.error(f"past_state must have shape {state_shape}, got {past_state.shape}")
    state = (np.zeros(state_shape, dtype=np.float32) if past_state is None
             else past_state.astype(np.float32))
    gates = None if decay is None else _decay_factors(ctx, decay, kv_num_heads, key_size)
    rates = None if beta is None else _update_rates(ctx, beta, kv_num_heads)
    factor = np.float32(scale if scale else 1.0 / np.sqrt(key_size))
    groups = q_num_heads // kv_num_heads
    outputs = np.zeros((batch, q_num_heads, length, value_size), dtype=np.float32)
    for t in range(length):
        k_t, v_t = k[:, :, t], v[:, :, t]
        if gated:
            state = state * gates[:, :, t][..., None]
        if delta:
            recalled = np.einsum("bhkv,bhk->bhv", state, k_t)
            v_t = rates[:, :, t] * (v_t - recalled)
        state = state + k_t[..., :, None] * v_t[..., None, :]
        shared = np.repeat(state, groups, axis=1)
        outputs[:, :, t] = factor * np.einsum("bhk,bhkv->bhv", q[:, :, t], shared)
    state_dtype = query.dtype if past_state is None else past_state.dtype
    return _merge_heads(outputs).astype(query.dtype), state.astype(state_dtype)
