"""Train the cost model that ships with ember (``ember/tune/cost_model.txt``).

    # measure: tune each model unguided for a while, every measurement into one database
    .venv/bin/python tools/train_cost_model.py --collect --budget 3m --db costs.db \\
        --model ember/models/tinynet.onnx:input=8,3,32,32 --model resnet18.onnx ...
    # train on what the database holds for these models, report the ranking quality on
    # kernels held out of training, and write the model
    .venv/bin/python tools/train_cost_model.py --db costs.db --model ... \
        --out ember/tune/cost_model.txt

Samples are the valid measurements of every kernel of the given models on this machine:
the features of the candidate's scheduled kernel (``ember.tune.features``) and its speed
relative to the kernel's default schedule, ``log2(default time / time)`` (medians per
config).  A fifth of the kernels (by workload key) is held out: the model trained on the
rest ranks their candidates, and the pairwise accuracy and top-5 recall of that ranking are
printed -- the number to quote for how well the model transfers to kernels it never saw.
The shipped model is then trained on all kernels.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ember.core.target import Target  # noqa: E402
from ember.driver import BuildOptions, build_graph  # noqa: E402
from ember.driver.single_kernel import kernel_problems  # noqa: E402
from ember.frontend.onnx import import_onnx  # noqa: E402
from ember.schedule.config import KernelConfig  # noqa: E402
from ember.tune.cost_model import PRETRAINED_FILE, CostModel, ranking_quality  # noqa: E402
from ember.tune.database import TuningDatabase, target_key  # noqa: E402
from ember.tune.report import parse_budget, parse_model_spec  # noqa: E402
from ember.tune.space import ConfigSpace  # noqa: E402
from ember.tune.tuner import tune_build  # noqa: E402


def _build(path: Path, shapes: dict[str, tuple[int, ...]], target: Target):
    graph = import_onnx(path)
    full = {name: shapes.get(name) or tuple(int(d) for d in graph.types[name].shape)
            for name in graph.inputs}
    return build_graph(graph, full, BuildOptions(target=target))


def _samples(build, database: TuningDatabase, target: Target):
    """(features, log2 speedup, workload) of every valid measured config of every kernel."""
    tkey = target_key(target)
    seen = set()
    for problem in kernel_problems(build):
        if problem.workload_key in seen:
            continue
        seen.add(problem.workload_key)
        by_config: dict[str, list[float]] = {}
        refused = set()
        for record in database.records(problem.workload_key, tkey):
            config = record.config.to_json()
            if record.valid and record.seconds:
                by_config.setdefault(config, []).append(record.seconds)
            else:
                refused.add(config)
        space = ConfigSpace(problem, target)
        default = by_config.get(space.default.key)
        if not default:
            continue
        reference = statistics.median(default)
        for config, times in by_config.items():
            if config in refused:
                continue
            point = space.canonical(KernelConfig.from_json(config))
            if point is None:
                continue
            yield point.features, math.log2(reference / statistics.median(times)), \
                problem.workload_key


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", type=parse_model_spec, required=True,
                        metavar="PATH[:NAME=D,D,...]")
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--collect", action="store_true",
                        help="tune every model unguided first (--budget each)")
    parser.add_argument("--budget", default="3m")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"write the model here (e.g. {PRETRAINED_FILE})")
    args = parser.parse_args()
    target = Target.native()
    builds = [(path, _build(path, shapes, target)) for path, shapes in args.model]
    with TuningDatabase(args.db) as database:
        if args.collect:
            for path, build in builds:
                print(f"collecting: {path.name}", flush=True)
                tune_build(build, database, budget_seconds=parse_budget(args.budget),
                           use_model=False)
        rows = [row for _, build in builds for row in _samples(build, database, target)]
    if len(rows) < 20:
        print(f"only {len(rows)} samples: collect more (--collect)")
        return 1
    features = np.stack([r[0] for r in rows])
    speedups = np.array([r[1] for r in rows])
    groups = [r[2] for r in rows]
    held = np.array([int(hashlib.sha256(g.encode()).hexdigest(), 16) % 5 == 0 for g in groups])
    print(f"{len(rows)} samples of {len(set(groups))} kernels "
          f"({int(held.sum())} samples of {len({g for g, h in zip(groups, held) if h})} "
          f"kernels held out)")
    if held.any() and (~held).any():
        model = CostModel().fit(features[~held], speedups[~held])
        quality = ranking_quality(model.predict(features[held]), speedups[held],
                                  [g for g, h in zip(groups, held) if h])
        print("held-out ranking quality: " +
              ", ".join(f"{k} {v:.3f}" if k.endswith(("accuracy", "recall")) else
                        f"{k} {int(v)}" for k, v in quality.items()))
    if args.out is not None:
        CostModel().fit(features, speedups).save(args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
