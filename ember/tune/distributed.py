"""Tuning on a Ray cluster: every node tunes for its own machine, all records in one database.

A config's time is a property of the machine that measured it, so the nodes of a cluster do
not share a search: each node compiles the model for its own CPU (``Target.native()`` there)
and runs the whole tuning loop on it (``ember.tune.tuner.tune_build``: its own build
workers and runner, its own budget) into a database of its own, and sends back what that
database holds; the driver adds every node's records and decisions to the one database the
user named, each under the node's own target key.  Nodes with the same CPU and the same
key measure the same kernels twice, which is the price of not trusting one machine's times
for another; ``ember.compile(tuning_db=)`` on a machine applies only records of its key.

Needs the ``distributed`` extra (``pip install 'ember[distributed]'``, which brings Ray).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Mapping

from ember.core.errors import EmberError
from ember.ir.graph import Graph
from ember.tune.database import Record, TuningDatabase
from ember.tune.tuner import TuneResult

# A local instance's object store: the model's graph and the records pass through it.
LOCAL_OBJECT_STORE_BYTES = 256 << 20
_RAY_ENVIRONMENT = {"RAY_USAGE_STATS_ENABLED": "0"}


@dataclass(frozen=True)
class NodeResult:
    """What one node tuned: its address, target key, result, and its database's contents."""

    node: str
    target_key: str
    result: TuneResult
    records: tuple[Record, ...]
    decisions: tuple[tuple[str, str, Any], ...]  # (workload, target, KernelConfig)


def _tune_here(graph: Graph, shapes: Mapping[str, tuple[int, ...]], budget_seconds: float,
               opt_level: int, workers: int, seed: int) -> NodeResult:
    """The remote part: tune on this node into a scratch database and return its contents."""
    import ray

    from ember.core.target import Target
    from ember.driver.pipeline import BuildOptions, build_graph
    from ember.tune.tuner import tune_build

    target = Target.native()
    build = build_graph(graph, dict(shapes), BuildOptions(target=target, opt_level=opt_level))
    with tempfile.TemporaryDirectory(prefix="ember-tune-node-") as folder:
        with TuningDatabase(os.path.join(folder, "node.db")) as database:
            result = tune_build(build, database, budget_seconds=budget_seconds, target=target,
                                opt_level=opt_level, workers=workers, seed=seed)
            records = tuple(database.records())
            decisions = tuple((w, t, database.decision(w, t)) for w in database.workloads()
                              for t in {r.target_key for r in records if r.workload_key == w}
                              if database.decision(w, t) is not None)
    return NodeResult(ray.get_runtime_context().get_node_id(), result.target_key, result,
                      records, decisions)


def tune_on_ray(graph: Graph, shapes: Mapping[str, tuple[int, ...]], database: TuningDatabase,
                *, budget_seconds: float, address: str | None = None, opt_level: int = 2,
                workers: int = 0, seed: int = 0) -> list[NodeResult]:
    """Tune ``graph`` at ``shapes`` on every alive node of the Ray cluster at ``address``
    (``None``: ``$RAY_ADDRESS``, else a local instance started for the run); every node's
    records and decisions are added to ``database``.  Returns one result per node."""
    for key, value in _RAY_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    except ImportError:
        raise EmberError("tuning on Ray needs the distributed extra: "
                         "pip install 'ember[distributed]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        local = address in (None, "local") and "RAY_ADDRESS" not in os.environ
        ray.init(address=None if address in (None, "local") else address,
                 include_dashboard=False, log_to_driver=False,
                 **({"object_store_memory": LOCAL_OBJECT_STORE_BYTES} if local else {}))
    try:
        nodes = [node for node in ray.nodes() if node.get("Alive")]
        if not nodes:
            raise EmberError(f"the Ray cluster at {address or 'RAY_ADDRESS'} has no alive node")
        remote = ray.remote(_tune_here)
        graph_ref = ray.put(graph)
        # each node's task takes its CPUs: its build workers and runner must not share them
        pending = [remote.options(
            num_cpus=max(1, int(node.get("Resources", {}).get("CPU", 1))),
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
        ).remote(graph_ref, dict(shapes), budget_seconds, opt_level, workers, seed)
            for node in nodes]
        results: list[NodeResult] = ray.get(pending)
    finally:
        if started_here:
            ray.shutdown()
    for node in results:
        database.add_many(node.records)
        for workload, target, config in node.decisions:
            database.decide(workload, target, config)
    return results
