"""String ops and text features: StringConcat, StringSplit, StringNormalizer, RegexFullMatch
and TfIdfVectorizer.

Strings are numpy object arrays of Python ``str``.  RegexFullMatch compiles its pattern with
Python's ``re``, which accepts the RE2 syntax ONNX specifies for the usual constructs.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from ember.core.dims import Dim
from ember.core.dtypes import DType
from ember.core.errors import ShapeError
from ember.ir.types import TensorType, ValueType
from ember.ops.registry import REQUIRED, Attr, InferContext, RefContext, op
from ember.ops.shape_infer import broadcast_shapes, tensor_input


def _string_input(ctx: InferContext, index: int) -> TensorType:
    vtype = tensor_input(ctx, index)
    if vtype.dtype != DType.STRING:
        raise ctx.error(f"input {index} must be a string tensor, got {vtype}")
    return vtype


def _as_strings(values: np.ndarray) -> np.ndarray:
    """An object array of str (numpy unicode arrays are converted)."""
    return np.asarray(values).astype(object)


# ----------------------------------------------------------------------------- StringConcat


def _infer_string_concat(ctx: InferContext) -> list[ValueType | None]:
    shapes = [_string_input(ctx, 0).shape, _string_input(ctx, 1).shape]
    try:
        return [TensorType(DType.STRING, broadcast_shapes(shapes))]
    except ShapeError as error:
        raise ctx.error(str(error)) from None


@op("StringConcat", family="text", infer=_infer_string_concat)
def string_concat(ctx, x, y):
    """Elementwise x + y of two string tensors, with broadcasting."""
    return np.asarray(np.add(_as_strings(x), _as_strings(y)), dtype=object)


# ----------------------------------------------------------------------------- RegexFullMatch


def _infer_regex_full_match(ctx: InferContext) -> list[ValueType | None]:
    _compile(ctx, ctx.attrs["pattern"])
    return [TensorType(DType.BOOL, _string_input(ctx, 0).shape)]


def _compile(ctx: InferContext | RefContext, pattern: str | None) -> re.Pattern:
    if pattern is None:
        raise ctx.error("the 'pattern' attribute is required")
    try:
        return re.compile(pattern)
    except re.error as error:
        raise ctx.error(f"invalid regular expression {pattern!r}: {error}") from None


@op("RegexFullMatch", family="text", infer=_infer_regex_full_match,
    attrs={"pattern": Attr.string(None)})
def regex_full_match(ctx, x, *, pattern):
    """True where the whole string matches ``pattern``."""
    regex = _compile(ctx, pattern)
    flat = [regex.fullmatch(s) is not None for s in _as_strings(x).reshape(-1)]
    return np.array(flat, dtype=np.bool_).reshape(x.shape)


# ----------------------------------------------------------------------------- StringSplit


def _infer_string_split(ctx: InferContext) -> list[ValueType | None]:
    x = _string_input(ctx, 0)
    if x.shape is None:
        return [TensorType(DType.STRING, None), TensorType(DType.INT64, None)]
    return [TensorType(DType.STRING, x.shape + (None,)), TensorType(DType.INT64, x.shape)]


def _split_one(text: str, separator: str | None, limit: int) -> list[str]:
    """The substrings of one element (none for an empty string, as in ONNX Runtime)."""
    if separator is None:  # runs of whitespace; leading and trailing whitespace dropped
        return text.strip().split(None, limit)
    return text.split(separator, limit) if text else []


@op("StringSplit", family="text", infer=_infer_string_split, outputs=(2, 2),
    attrs={"delimiter": Attr.string(None), "maxsplit": Attr.int(None)})
def string_split(ctx, x, *, delimiter, maxsplit):
    """Split each string on ``delimiter`` (runs of whitespace when unset or empty), at most
    ``maxsplit`` times; substrings are padded with "" to a common count."""
    parts = [_split_one(s, delimiter or None, -1 if maxsplit is None else maxsplit)
             for s in _as_strings(x).reshape(-1)]
    width = max((len(p) for p in parts), default=0)
    substrings = np.full((len(parts), width), "", dtype=object)
    for row, pieces in enumerate(parts):
        substrings[row, :len(pieces)] = pieces
    counts = np.array([len(p) for p in parts], dtype=np.int64)
    return substrings.reshape(x.shape + (width,)), counts.reshape(x.shape)


# ----------------------------------------------------------------------------- StringNormalizer

_CASE_ACTIONS = ("NONE", "LOWER", "UPPER")


def _infer_string_normalizer(ctx: InferContext) -> list[ValueType | None]:
    x = _string_input(ctx, 0)
    if ctx.attrs["case_change_action"] not in _CASE_ACTIONS:
        raise ctx.error(f"case_change_action must be one of {_CASE_ACTIONS}, got "
                        f"'{ctx.attrs['case_change_action']}'")
    if x.shape is None:
        return [TensorType(DType.STRING, None)]
    if len(x.shape) == 1 or (len(x.shape) == 2 and x.shape[0] == 1):
        # Stop words remove a data-dependent number of elements; no element left gives [""].
        kept: Dim = x.shape[-1] if not ctx.attrs["stopwords"] else None
        kept = 1 if kept == 0 else kept
        return [TensorType(DType.STRING, x.shape[:-1] + (kept,))]
    raise ctx.error(f"StringNormalizer takes a [C] or [1, C] tensor, got {x}")


@op("StringNormalizer", family="text", infer=_infer_string_normalizer,
    attrs={
        "case_change_action": Attr.string("NONE"),
        "is_case_sensitive": Attr.int(0),
        "locale": Attr.string(None),
        "stopwords": Attr.strings(None),
    })
def string_normalizer(ctx, x, *, case_change_action, is_case_sensitive, locale, stopwords):
    """Drop the elements that are stop words, then change case; a result with no element is
    [""] (shape [1], or [1, 1] for a [1, C] input)."""
    if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
        raise ctx.error(f"StringNormalizer takes a [C] or [1, C] tensor, got shape {x.shape}")
    words = list(_as_strings(x).reshape(-1))
    if stopwords:
        if is_case_sensitive:
            stops = set(stopwords)
            words = [w for w in words if w not in stops]
        else:
            stops = {s.lower() for s in stopwords}
            words = [w for w in words if w.lower() not in stops]
    if case_change_action == "LOWER":
        words = [w.lower() for w in words]
    elif case_change_action == "UPPER":
        words = [w.upper() for w in words]
    elif case_change_action != "NONE":
        raise ctx.error(f"case_change_action must be one of {_CASE_ACTIONS}, got "
                        f"'{case_change_action}'")
    result = np.array(words or [""], dtype=object)
    return result.reshape((1, -1)) if x.ndim == 2 else result


# ----------------------------------------------------------------------------- TfIdfVectorizer

_TFIDF_MODES = ("TF", "IDF", "TFIDF")


def _tfidf_output_size(ctx: InferContext | RefContext, ngram_indexes: Sequence[int]) -> int:
    if not ngram_indexes:
        raise ctx.error("ngram_indexes must not be empty")
    if min(ngram_indexes) < 0:
        raise ctx.error("ngram_indexes must be non-negative")
    return max(ngram_indexes) + 1


def _infer_tfidf(ctx: InferContext) -> list[ValueType | None]:
    x = tensor_input(ctx, 0)
    attrs = ctx.attrs
    if attrs["mode"] not in _TFIDF_MODES:
        raise ctx.error(f"mode must be one of {_TFIDF_MODES}, got '{attrs['mode']}'")
    size = _tfidf_output_size(ctx, attrs["ngram_indexes"])
    if x.shape is None:
        return [TensorType(DType.FLOAT32, None)]
    if len(x.shape) == 1:
        return [TensorType(DType.FLOAT32, (size,))]
    if len(x.shape) == 2:
        return [TensorType(DType.FLOAT32, (x.shape[0], size))]
    raise ctx.error(f"TfIdfVectorizer takes a [C] or [N, C] tensor, got {x}")


def _ngram_table(ctx: RefContext, pool: list, ngram_counts: Sequence[int],
                 ngram_indexes: Sequence[int], min_n: int, max_n: int) -> dict[tuple, int]:
    """Map each pool n-gram whose length is in [min_n, max_n] to its output coordinate."""
    table: dict[tuple, int] = {}
    ngram_number = 0
    for level, start in enumerate(ngram_counts):
        n = level + 1
        end = ngram_counts[level + 1] if level + 1 < len(ngram_counts) else len(pool)
        if (end - start) % n:
            raise ctx.error(f"the pool's {n}-grams (items {start}..{end}) are not a whole "
                            f"number of {n}-grams")
        for offset in range(start, end, n):
            if ngram_number >= len(ngram_indexes):
                raise ctx.error("ngram_indexes has fewer entries than the pool has n-grams")
            if min_n <= n <= max_n:
                table[tuple(pool[offset:offset + n])] = ngram_indexes[ngram_number]
            ngram_number += 1
    return table


def _count_ngrams(row: list, table: dict[tuple, int], min_n: int, max_n: int,
                  max_skip: int, counts: np.ndarray) -> None:
    """Add to ``counts`` every n-gram of ``row`` found in ``table``, for all skips up to
    ``max_skip`` (unigrams count once: skipping does not change them)."""
    for n in range(min_n, max_n + 1):
        skips = range(max_skip + 1) if n > 1 else range(1)
        for skip in skips:
            stride = skip + 1
            for start in range(len(row) - (n - 1) * stride):
                index = table.get(tuple(row[start:start + (n - 1) * stride + 1:stride]))
                if index is not None:
                    counts[index] += 1


@op("TfIdfVectorizer", family="text", infer=_infer_tfidf,
    attrs={
        "max_gram_length": Attr.int(REQUIRED),
        "max_skip_count": Attr.int(REQUIRED),
        "min_gram_length": Attr.int(REQUIRED),
        "mode": Attr.string(REQUIRED),
        "ngram_counts": Attr.ints(REQUIRED),
        "ngram_indexes": Attr.ints(REQUIRED),
        "pool_int64s": Attr.ints(None),
        "pool_strings": Attr.strings(None),
        "weights": Attr.floats(None),
    })
def tfidf_vectorizer(ctx, x, *, max_gram_length, max_skip_count, min_gram_length, mode,
                     ngram_counts, ngram_indexes, pool_int64s, pool_strings, weights):
    """Count the pool's n-grams (with skips) in each row of ``x``, weighted as ``mode`` says:
    TF counts, IDF weight where present, TFIDF count * weight."""
    if (pool_int64s is None) == (pool_strings is None):
        raise ctx.error("exactly one of pool_int64s and pool_strings must be set")
    if mode not in _TFIDF_MODES:
        raise ctx.error(f"mode must be one of {_TFIDF_MODES}, got '{mode}'")
    if not 1 <= min_gram_length <= max_gram_length:
        raise ctx.error(f"n-gram lengths must satisfy 1 <= min_gram_length ({min_gram_length})"
                        f" <= max_gram_length ({max_gram_length})")
    if x.ndim not in (1, 2):
        raise ctx.error(f"TfIdfVectorizer takes a [C] or [N, C] tensor, got shape {x.shape}")
    pool = list(pool_strings) if pool_strings is not None else [int(v) for v in pool_int64s]
    size = _tfidf_output_size(ctx, ngram_indexes)
    table = _ngram_table(ctx, pool, ngram_counts, ngram_indexes, min_gram_length,
                         max_gram_length)
    rows = x.reshape(1, -1) if x.ndim == 1 else x
    counts = np.zeros((rows.shape[0], size), dtype=np.float32)
    for row, out in zip(rows, counts):
        values = [str(v) for v in row] if pool_strings is not None else [int(v) for v in row]
        _count_ngrams(values, table, min_gram_length, max_gram_length, max_skip_count, out)
    scale = np.ones(size, dtype=np.float32)
    if weights:
        if len(weights) != len(ngram_indexes):
            raise ctx.error(f"weights has {len(weights)} entries; there are "
                            f"{len(ngram_indexes)} n-grams")
        scale[list(ngram_indexes)] = weights  # the i-th weight is that of the i-th n-gram
    if mode == "IDF":
        counts = np.where(counts > 0, scale, 0).astype(np.float32)
    elif mode == "TFIDF":
        counts = counts * scale
    return counts.reshape(size) if x.ndim == 1 else counts
