"""A build worker of the tuner: schedules, generates and compiles candidates, one at a time.

The tuner runs several of these (``ember.tune.measure``); each reads one JSON request per
line and answers with one line:

    request   {"problem": PICKLE, "config": JSON or null, "out": DIR}
    answer    {"ok": true} | {"ok": false, "error": "why the candidate cannot be built"}

``PICKLE`` is a file the tuner wrote (the kernel problem and the target): the worker trusts it
as it trusts its parent.  A worker is a process of its own rather than a ``multiprocessing``
child, so that a script calling ``ember.tune`` needs no ``if __name__ == "__main__"`` guard,
and a worker that dies or hangs is replaced without disturbing the others.
"""

from __future__ import annotations

import json
import pickle
import sys
from typing import Any

_PROBLEMS: dict[str, Any] = {}


def build(request: dict[str, Any]) -> dict[str, Any]:
    from ember.driver.single_kernel import build_kernel
    from ember.package.artifact import save_artifact
    from ember.schedule.config import KernelConfig

    path = request["problem"]
    if path not in _PROBLEMS:
        with open(path, "rb") as f:
            _PROBLEMS[path] = pickle.load(f)
    problem, target = _PROBLEMS[path]
    config = KernelConfig.from_json(request["config"]) if request.get("config") else None
    save_artifact(build_kernel(problem, target, config), request["out"])
    return {"ok": True}


def main() -> int:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = build(json.loads(line))
        except Exception as error:  # noqa: BLE001 -- the candidate failed, the search goes on
            answer = {"ok": False, "error": f"{type(error).__name__}: {str(error)[:2000]}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
