"""A measuring process that misbehaves on purpose, for the tuner's tests.

It speaks the protocol of ``ember.tune.runner`` and measures honestly a candidate built with
the default schedule (its manifest lists no config); every other candidate is, by a hash of
its config, measured honestly or: crashes the process (SIGABRT), hangs, or returns outputs
that are off by one while claiming a time faster than any real kernel -- the candidate a
tuner that trusted its runner would pick.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from ember.tune.runner import measure

FAULTS = ("crash", "hang", "wrong", None)


def fault_of(config: dict | None) -> str | None:
    if not config:
        return None
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).digest()
    return FAULTS[digest[0] % len(FAULTS)]


def config_of(artifact: str) -> dict | None:
    manifest = json.loads((Path(artifact) / "manifest.json").read_text())
    entries = manifest.get("schedules", [])
    return entries[0]["config"] if entries else None


def main() -> int:
    for line in sys.stdin:
        request = json.loads(line)
        fault = fault_of(config_of(request["artifact"]))
        if fault == "crash":
            os.abort()
        if fault == "hang":
            time.sleep(3600)
        answer = measure(request)
        if fault == "wrong" and answer.get("ok"):
            with np.load(request["outputs"]) as data:
                outputs = {name: data[name] + 1 for name in data.files}
            np.savez(request["outputs"], **outputs)
            answer["seconds"] = 1e-9
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
