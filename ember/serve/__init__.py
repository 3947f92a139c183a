"""``ember serve``: an inference server for ember artifacts.

    from ember.serve import BatchPolicy, ServedModel, create_app, serving
    model = ServedModel("resnet", "resnet.ember")          # a saved artifact
    app = create_app([model], {"resnet": BatchPolicy(max_batch=16)})
    with serving(app) as url:                             # a background server on a free port
        ...                                               # POST {url}/v2/models/resnet/infer

The protocol is the Open Inference Protocol (KServe V2, :mod:`ember.serve.app`), requests are
batched per model (:mod:`ember.serve.batcher`), metrics are at ``/metrics``.  Needs the
``serve`` extra (FastAPI, uvicorn, prometheus-client): ``pip install 'ember[serve]'``.
"""

from __future__ import annotations

try:
    import fastapi  # noqa: F401
    import prometheus_client  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as missing:  # pragma: no cover - depends on the installation
    raise ImportError(f"ember.serve needs the 'serve' extra ({missing.name} is not installed): "
                      f"pip install 'ember[serve]'") from missing

from ember.serve.app import ServerLimits, create_app
from ember.serve.batcher import BatchPolicy
from ember.serve.model import ServedModel
from ember.serve.server import run, serving

__all__ = ["BatchPolicy", "ServedModel", "ServerLimits", "create_app", "run", "serving"]
