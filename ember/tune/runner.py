"""The measuring process of the tuner: loads candidate kernels and times them, nothing else.

A candidate is a one-kernel artifact (``ember.driver.single_kernel``).  Loading it runs code
the search generated, which may crash, hang or write out of bounds; so it runs here, in a
process of its own that the tuner restarts when that happens (``ember.tune.measure``), and
one bad candidate costs that candidate only.  The protocol is one JSON object per line:

    request   {"artifact": DIR, "inputs": NPZ, "outputs": NPZ, "repeat": R, "warmup": W}
    answer    {"ok": true, "seconds": median time of the steps,
               "steps": [median time of each step]}
              {"ok": false, "error": "what went wrong"}

The outputs of one ordinary run are written to ``outputs`` for the tuner to check against its
oracle; then the steps are timed ``repeat`` times (``CompiledModel.profile``, medians).  A
candidate has one step; a whole model (the tuner's check of its decisions in the model) has
many.

One library is loaded at a time.  Timing a candidate in turns with its task's default
kernel, both loaded in this process, was tried and dropped: the two libraries' thread pools
then compete for the two cores (one's workers still spin while the other runs), and one of
the pair ran up to 1.9x slower in some rounds -- a bias, not a cancellation, of the host's
noise.  Only the
runtime is imported: this is how a deployment runs the kernel.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any

import numpy as np

from ember.runtime.loader import load
from ember.runtime.model import aligned_empty


def _aligned(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` on a 64-byte boundary: the kernel of a value that lives in its
    model's workspace relies on the workspace's alignment."""
    copy = aligned_empty(array.nbytes, zeroed=False).view(array.dtype).reshape(array.shape)
    copy[...] = array
    return copy


def measure(request: dict[str, Any]) -> dict[str, Any]:
    model = load(request["artifact"])
    with np.load(request["inputs"], allow_pickle=False) as data:
        feeds = {name: _aligned(data[name]) for name in data.files}
    outputs = model.run(feeds)
    np.savez(request["outputs"], **outputs)
    # Run for a while before timing: the first calls of a fresh process (or after a pause)
    # take up to twice as long, while its threads and caches wake up.
    started = time.perf_counter()
    while time.perf_counter() - started < float(request.get("warmup_seconds", 0.1)):
        model.run(feeds)
    steps = model.profile(feeds, repeat=int(request["repeat"]),
                          warmup=int(request["warmup"])).samples
    return {"ok": True, "seconds": float(np.median(steps.sum(axis=1))),
            "steps": [float(s) for s in np.median(steps, axis=0)]}


def main() -> int:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = measure(json.loads(line))
        except Exception as error:  # noqa: BLE001 -- the tuner records why, and goes on
            answer = {"ok": False, "error": f"{type(error).__name__}: {error}",
                      "trace": traceback.format_exc(limit=4)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
