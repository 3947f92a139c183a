"""``ember.runtime.load``: open a saved model, whichever of the two artifact kinds it is."""

from __future__ import annotations

from pathlib import Path

from ember.runtime.blocked import BLOCKS_FILE, BatchBlockedModel
from ember.runtime.files import ArtifactDirectory
from ember.runtime.model import CompiledModel, HostResolver


def load(path: str | Path, host_resolver: HostResolver | None = None, *,
         expected_digest: str | None = None) -> CompiledModel | BatchBlockedModel:
    """Load an artifact directory written by ``ember.Module.save``: a model compiled for one
    set of input shapes (:class:`CompiledModel`), or one that runs any batch size in blocks
    (:class:`BatchBlockedModel`, when the directory holds ``blocks.json``).

    ``expected_digest`` (the ``digest`` of a model loaded earlier) refuses any other
    artifact; without it, loading an artifact runs its library's code, so load only artifacts
    from a source you trust.
    """
    with ArtifactDirectory(path) as directory:
        blocked = directory.exists(BLOCKS_FILE)
    if blocked:
        return BatchBlockedModel(path, host_resolver, expected_digest=expected_digest)
    return CompiledModel(path, host_resolver, expected_digest=expected_digest)
