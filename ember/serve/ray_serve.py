"""The same server as a Ray Serve deployment: replicas across a Ray cluster.

Each replica is the server of :func:`ember.serve.create_app` -- the same protocol, routes,
batching policy, limits and metrics -- built inside the replica from the artifact paths (so
the artifacts, not Python objects, travel to the replicas; every node must see them at the
same path, e.g. on a shared file system, and the digests make sure each replica serves the
same bytes).  Ray Serve's proxy spreads requests over the replicas; each replica batches what
it receives.

Ray Serve caps the requests a replica holds at once (``max_ongoing_requests``, 5 by default):
below the batch size, that cap would keep every batch small (ray-project/ray#43288), so it is
set from the policy to what the replica's queues can hold.

Needs the ``distributed`` extra: ``pip install 'ember[distributed]'``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ember.runtime import EmberError
from ember.serve.app import ServerLimits, create_app
from ember.serve.batcher import BatchPolicy
from ember.serve.model import ServedModel

log = logging.getLogger("ember.serve")

# Ray asks for neither of these to run a local cluster; off unless the user set them.
_RAY_DEFAULTS = {"RAY_USAGE_STATS_ENABLED": "0"}
LOCAL_OBJECT_STORE_BYTES = 256 << 20


@dataclass(frozen=True)
class ModelSpec:
    """What a replica needs to load one model."""

    name: str
    path: str
    digest: str | None = None


class EmberReplica:
    """One replica: loads the models and builds the server's app (Ray Serve calls
    ``__serve_build_asgi_app__`` after the constructor)."""

    def __init__(self, specs: Sequence[ModelSpec], policies: dict[str, BatchPolicy],
                 limits: ServerLimits, workers: int, threads: int | None):
        self._models = [ServedModel(spec.name, spec.path, digest=spec.digest, workers=workers,
                                    threads=threads) for spec in specs]
        self._policies = policies
        self._limits = limits

    def __serve_build_asgi_app__(self) -> Any:
        return create_app(self._models, self._policies, self._limits)


def ray_application(specs: Sequence[ModelSpec], policies: dict[str, BatchPolicy] | None = None,
                    limits: ServerLimits = ServerLimits(), *, replicas: int = 2,
                    workers: int = 1, threads: int | None = None,
                    cpus_per_replica: float = 0) -> Any:
    """A Ray Serve application serving ``specs`` from ``replicas`` replicas (pass it to
    ``ray.serve.run``).  ``cpus_per_replica`` is what Ray reserves for each (0: no
    reservation, so that several replicas fit on a small machine)."""
    from ray import serve

    if replicas < 1:
        raise EmberError(f"replicas must be at least 1, not {replicas}")
    policies = policies or {}
    for spec in specs:  # the paths must mean the same on every node: make them absolute
        if not Path(spec.path).is_absolute():
            raise EmberError(f"model '{spec.name}': give the artifact's absolute path, which "
                             f"every node of the cluster sees")
    # What one replica can hold: every model's queue and its running batches.
    ongoing = sum(policy.max_queue + policy.max_batch * workers for policy in
                  (policies.get(spec.name, BatchPolicy()) for spec in specs))
    deployment = serve.deployment(
        serve.ingress()(EmberReplica), name="ember", num_replicas=replicas,
        max_ongoing_requests=ongoing, max_queued_requests=ongoing,
        ray_actor_options={"num_cpus": cpus_per_replica})
    return deployment.bind(list(specs), policies, limits, workers, threads)


def run_on_ray(specs: Sequence[ModelSpec], policies: dict[str, BatchPolicy],
               limits: ServerLimits, *, host: str, port: int, replicas: int, workers: int,
               threads: int | None, address: str | None = None) -> None:
    """Start (or join, with ``address`` or ``RAY_ADDRESS``) a Ray cluster, serve there until
    SIGINT/SIGTERM, then take the deployment down."""
    for key, value in _RAY_DEFAULTS.items():
        os.environ.setdefault(key, value)
    import ray
    from ray import serve

    local = address is None and "RAY_ADDRESS" not in os.environ
    # A local cluster's object store would take 30 % of the memory in /dev/shm; requests and
    # responses pass through it only when large, so a modest store does.
    ray.init(address=address, include_dashboard=False, log_to_driver=False,
             **({"object_store_memory": LOCAL_OBJECT_STORE_BYTES} if local else {}))
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which sets its own
        signal.signal(number, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(ray_application(specs, policies, limits, replicas=replicas, workers=workers,
                                  threads=threads), name="ember", route_prefix="/")
        log.info("serving on Ray Serve at http://%s:%d with %d replica(s)", host, port,
                 replicas)
        stop.wait()
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
