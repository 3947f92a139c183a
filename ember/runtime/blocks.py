"""Run a batch as blocks of samples, each through code compiled for that block size.

A model whose graph keeps samples apart (``ember.passes.batch_split``) gives, for rows
``[s, s + B)`` of its batch inputs, rows ``[k*s, k*(s + B))`` of each batch output (along
axis 0, or the output's own batch axis: a recurrent layer's final states have it second).
So a call with any batch size is served by the specializations already compiled: a plan of
blocks (``[(16, run16), (16, run16), (1, run1)]`` for 33 samples) whose results are joined
along that axis.  Inputs without the batch go to every block whole; outputs without it are the same for
every block and are taken from the first.  Caller-given outputs (``out=``) are written in
place: each block writes its rows of a batch output into that output's rows, and the first
block writes the outputs without the batch.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from ember.runtime.binding import check_output
from ember.runtime.dtypes import numpy_dtype
from ember.runtime.errors import InputError

# runner(inputs) or runner(inputs, out): out by name, the caller's arrays of some outputs
BlockRunner = Callable[..., dict[str, np.ndarray]]


def plan_blocks(batch: int, sizes: Collection[int]) -> list[int] | None:
    """The block sizes, largest first, that add up to ``batch`` using only ``sizes``
    (greedy: few calls, the biggest blocks); None when ``sizes`` cannot (no block of 1)."""
    plan, rest = [], batch
    for size in sorted(set(sizes), reverse=True):
        if size <= 0:
            continue
        count, rest = divmod(rest, size)
        plan.extend([size] * count)
    return plan if rest == 0 else None


def check_block_outputs(out: Mapping[str, Any], specs: Sequence[Any], block_size: int,
                        batch: int, batch_outputs: Sequence[str],
                        output_axes: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Caller-given outputs of a call of ``batch`` samples run in blocks, checked against the
    whole call's shapes (``specs``: the outputs of a block of ``block_size`` samples, whose
    batch outputs hold the same rows per sample along their batch axis: 0, or the one
    ``output_axes`` gives); as plain arrays, by name."""
    checked = {}
    for spec in specs:
        if spec.name not in out:
            continue
        shape = tuple(spec.shape)
        if spec.name in batch_outputs:
            axis = (output_axes or {}).get(spec.name, 0)
            shape = (*shape[:axis], shape[axis] // block_size * batch, *shape[axis + 1:])
        checked[spec.name] = check_output(spec.name, out[spec.name], numpy_dtype(spec.dtype),
                                          shape)
    unknown = sorted(set(out) - set(checked))
    if unknown:
        raise InputError(f"out= names unknown output(s) {unknown}; the model's outputs are "
                         f"{[spec.name for spec in specs]}")
    return checked


def run_in_blocks(feeds: Mapping[str, np.ndarray], batch_inputs: Sequence[str],
                  batch_outputs: Sequence[str], blocks: Sequence[tuple[int, BlockRunner]],
                  out: Mapping[str, np.ndarray] | None = None,
                  output_axes: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Run ``blocks`` (block size, runner) over consecutive samples of ``feeds``.

    Every input named in ``batch_inputs`` must have exactly the sum of the block sizes as its
    first dim (the caller checked the shapes against the model's).  A batch output's blocks
    are joined along axis 0, or along the axis ``output_axes`` gives it.  ``out``: arrays, by
    output name, that take those outputs of the whole call (checked by the caller with
    :func:`check_block_outputs`); the result holds them.  (One whose batch is not first is
    joined, then copied in: a block's part of it is not contiguous.)
    """
    axes = output_axes or {}
    batch = sum(size for size, _ in blocks)
    start = 0
    first: dict[str, np.ndarray] | None = None
    parts: dict[str, list[np.ndarray]] = {name: [] for name in batch_outputs
                                          if not out or name not in out or name in axes}
    for size, run in blocks:
        block = {name: (value[start:start + size] if name in batch_inputs else value)
                 for name, value in feeds.items()}
        if out:
            rows = {name: target.shape[0] // batch for name, target in out.items()
                    if name in batch_outputs and name not in axes}
            block_out = {name: (target[rows[name] * start:rows[name] * (start + size)]
                                if name in rows else target)
                         for name, target in out.items()
                         if name in rows or (first is None and name not in batch_outputs)}
            outputs = run(block, block_out)
        else:
            outputs = run(block)
        if first is None:
            first = outputs
        for name, pieces in parts.items():
            pieces.append(outputs[name])
        start += size
    if first is None:
        raise ValueError("run_in_blocks needs at least one block")
    result = dict(first)
    for name, pieces in parts.items():
        result[name] = pieces[0] if len(pieces) == 1 else \
            np.concatenate(pieces, axis=axes.get(name, 0))
    if out:
        for name, target in out.items():
            if name in axes:
                np.copyto(target, result[name])
        result.update(out)
    return result
