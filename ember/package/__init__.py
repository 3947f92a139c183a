"""Writing compiled models as artifacts (the runtime reads them)."""

from ember.package.artifact import save_artifact, save_batch_blocks

__all__ = ["save_artifact", "save_batch_blocks"]
