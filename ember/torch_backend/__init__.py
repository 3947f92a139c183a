"""``torch.compile(model, backend="ember")`` and ``ember.explain``.

Importing this package imports torch.  The backend is registered with Dynamo through the
``torch_dynamo_backends`` entry point, so ``backend="ember"`` works after installing ember.
"""

from ember.torch_backend.backend import REPORTS, GraphReport, ember_backend
from ember.torch_backend.explain import Explanation, explain

__all__ = ["Explanation", "GraphReport", "REPORTS", "ember_backend", "explain"]
