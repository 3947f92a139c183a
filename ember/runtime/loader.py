"""``ember.runtime.load``: open a saved model, whichever of the two artifact kinds it is."""

from __future__ import annotations

from pathlib import Path

from ember.runtime.blocked import BLOCKS_FILE, BatchBlockedModel
from ember.runtime.files import ArtifactDirectory
from ember.runtime.model import CompiledModel, HostResolver, WeightsCache


def load(path: str | Path, host_resolver: HostResolver | None = None, *,
         expected_digest: str | None = None, threads: int | None = None,
         weights_cache: WeightsCache | None = None) -> CompiledModel | BatchBlockedModel:
    """Load an artifact directory written by ``ember.Module.save``: a model compiled for one
    set of input shapes (:class:`CompiledModel`), or one that runs any batch size in blocks
    (:class:`BatchBlockedModel`, when the directory holds ``blocks.json``).

    ``expected_digest`` (the ``digest`` of a model loaded earlier) refuses any other
    artifact; without it, loading an artifact runs its library's code, so load only artifacts
    from a source you trust.

    ``threads`` is how many threads the kernels run on, the calling thread included
    (default: the CPUs this process may use: its affinity mask, capped by its cgroup CPU
    quota); ``model.set_num_threads`` changes it later.  The library owns its threads:
    no environment variable (``OMP_*`` or other) changes how they wait.

    ``weights_cache`` (a dict, empty at first) lets models loaded with the same dict share
    one copy of weights that are the same (the blocks of a batch-blocked artifact share theirs
    in any case): a server loading one artifact for several workers passes one dict.  Shared
    weights are read-only.
    """
    with ArtifactDirectory(path) as directory:
        blocked = directory.exists(BLOCKS_FILE)
    if blocked:
        return BatchBlockedModel(path, host_resolver, expected_digest=expected_digest,
                                 threads=threads, weights_cache=weights_cache)
    return CompiledModel(path, host_resolver, expected_digest=expected_digest, threads=threads,
                         weights_cache=weights_cache)
