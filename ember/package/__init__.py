"""Writing compiled models as artifacts (the runtime reads them)."""

from ember.package.artifact import save_artifact

__all__ = ["save_artifact"]
