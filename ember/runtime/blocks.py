"""Run a batch as blocks of samples, each through code compiled for that block size.

A model whose graph keeps samples apart (``ember.passes.batch_split``) gives, for rows
``[s, s + B)`` of its batch inputs, rows ``[k*s, k*(s + B))`` of each batch output.  So a call
with any batch size is served by the specializations already compiled: a plan of blocks
(``[(16, run16), (16, run16), (1, run1)]`` for 33 samples) whose results are joined along
axis 0.  Inputs without the batch go to every block whole; outputs without it are the same for
every block and are taken from the first.
"""

from __future__ import annotations

from typing import Callable, Collection, Mapping, Sequence

import numpy as np

BlockRunner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


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


def run_in_blocks(feeds: Mapping[str, np.ndarray], batch_inputs: Sequence[str],
                  batch_outputs: Sequence[str],
                  blocks: Sequence[tuple[int, BlockRunner]]) -> dict[str, np.ndarray]:
    """Run ``blocks`` (block size, runner) over consecutive samples of ``feeds``.

    Every input named in ``batch_inputs`` must have exactly the sum of the block sizes as its
    first dim (the caller checked the shapes against the model's).
    """
    start = 0
    first: dict[str, np.ndarray] | None = None
    parts: dict[str, list[np.ndarray]] = {name: [] for name in batch_outputs}
    for size, run in blocks:
        block = {name: (value[start:start + size] if name in batch_inputs else value)
                 for name, value in feeds.items()}
        outputs = run(block)
        if first is None:
            first = outputs
        for name in batch_outputs:
            parts[name].append(outputs[name])
        start += size
    if first is None:
        raise ValueError("run_in_blocks needs at least one block")
    result = dict(first)
    for name, pieces in parts.items():
        result[name] = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0)
    return result
