"""The HTTP face of the server: FastAPI routes of the Open Inference Protocol (KServe V2).

    GET  /v2/health/live              200 while the process serves
    GET  /v2/health/ready             200 when every model is loaded and the server is not
                                      shutting down, else 503
    GET  /v2                          server metadata
    GET  /v2/models/{name}            model metadata (a batch dim is -1)
    GET  /v2/models/{name}/ready
    POST /v2/models/{name}/infer      (also under /versions/1/)
    GET  /metrics                     Prometheus text format
    GET  /docs, /openapi.json         FastAPI's own pages

Every error is ``{"error": "..."}`` with its status: 400 for a malformed request or one that
does not fit the model, 404 for an unknown model, 413 for a body over the size limit, 429
when the model's queue is full, 503 while shutting down, 504 when the model did not answer in
time, 500 for a fault of the server itself.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import time
import zlib
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.routing import Route

from ember.runtime import EmberError
from ember.serve.batcher import BatchPolicy, ModelQueue
from ember.serve.metrics import UNKNOWN_MODEL, ServerMetrics
from ember.serve.model import ServedModel
from ember.serve.protocol import HEADER_LENGTH, ProtocolError, encode_response, parse_request

log = logging.getLogger("ember.serve")

SERVER_NAME = "ember"
_INFER_BODY = {  # the request body in the OpenAPI page (parsed by hand: binary data follows)
    "required": True,
    "content": {"application/json": {"schema": {
        "type": "object", "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": {"type": "object"},
            "inputs": {"type": "array", "items": {
                "type": "object", "required": ["name", "shape", "datatype"],
                "properties": {"name": {"type": "string"},
                               "shape": {"type": "array", "items": {"type": "integer"}},
                               "datatype": {"type": "string", "example": "FP32"},
                               "parameters": {"type": "object"},
                               "data": {"type": "array", "items": {}}}}},
            "outputs": {"type": "array", "items": {
                "type": "object", "required": ["name"],
                "properties": {"name": {"type": "string"},
                               "parameters": {"type": "object"}}}}}}}},
}


INFER_PATHS = ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{model_version}/infer")
_INFER_OPERATION = {
    "summary": "Run the model on the request's inputs",
    "parameters": [{"name": "name", "in": "path", "required": True,
                    "schema": {"type": "string"}},
                   {"name": "Inference-Header-Content-Length", "in": "header",
                    "required": False, "schema": {"type": "integer"},
                    "description": "the JSON's length when raw tensor bytes follow it"}],
    "requestBody": _INFER_BODY,
    "responses": {"200": {"description": "the outputs (JSON, or JSON then raw bytes)"},
                  "400": {"description": "a malformed request, or one the model cannot take"},
                  "404": {"description": "no such model or version"},
                  "413": {"description": "the body is over the size limit"},
                  "429": {"description": "the model's queue is full"},
                  "503": {"description": "the server is shutting down"},
                  "504": {"description": "the model did not answer in time"}},
}


@dataclass(frozen=True)
class ServerLimits:
    """Limits every request is held to."""

    max_payload_bytes: int = 64 << 20
    request_timeout: float = 30.0  # seconds from arrival to answer


def create_app(models: Sequence[ServedModel], policies: dict[str, BatchPolicy] | None = None,
               limits: ServerLimits = ServerLimits(), version: str | None = None) -> FastAPI:
    """The FastAPI application serving ``models`` (each with its policy from ``policies``,
    else the default :class:`BatchPolicy`).  Its lifespan starts the queues and, at shutdown,
    answers every accepted request before it returns."""
    version = version or _ember_version()
    names = [model.name for model in models]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise EmberError(f"two models are named {duplicates}; give each its own NAME=PATH")
    metrics = ServerMetrics()
    policies = policies or {}
    queues = {model.name: ModelQueue(model, policies.get(model.name, BatchPolicy()), metrics)
              for model in models}
    state = {"ready": False}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for queue in queues.values():
            await queue.start()
        state["ready"] = True
        try:
            yield
        finally:
            state["ready"] = False
            await asyncio.gather(*(queue.close() for queue in queues.values()))

    app = FastAPI(title="ember inference server", version=version, lifespan=lifespan,
                  description="The Open Inference Protocol (KServe V2) over ember artifacts.")
    app.state.queues = queues
    app.state.metrics = metrics

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    def queue_of(name: str) -> ModelQueue:
        queue = queues.get(name)
        if queue is None:
            raise ProtocolError(f"no model named {name[:128]!r}; this server serves "
                                f"{sorted(queues)}", status=404, kind="not_found")
        return queue

    @app.exception_handler(ProtocolError)
    async def protocol_error(_: Request, problem: ProtocolError) -> JSONResponse:
        return error(problem.status, str(problem))

    @app.get("/v2/health/live")
    async def live() -> dict:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        if not state["ready"]:
            return error(503, "the server is starting or shutting down")
        return JSONResponse({"ready": True})

    @app.get("/v2")
    async def server_metadata() -> dict:
        return {"name": SERVER_NAME, "version": version, "extensions": ["binary_tensor_data"]}

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{model_version}")
    async def model_metadata(name: str, model_version: str = "1") -> dict:
        _check_version(name, model_version)
        return queue_of(name).model.metadata()

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{model_version}/ready")
    async def model_ready(name: str, model_version: str = "1") -> Response:
        _check_version(name, model_version)
        queue_of(name)
        if not state["ready"]:
            return error(503, "the server is starting or shutting down")
        return JSONResponse({"name": name, "ready": True})

    async def infer(request: Request) -> Response:
        arrived = time.monotonic()
        name = request.path_params["name"]
        model_version = request.path_params.get("model_version", "1")
        label = name if name in queues else UNKNOWN_MODEL
        metrics.requests.labels(label).inc()
        try:
            _check_version(name, model_version)
            queue = queue_of(name)
            body = await _read_body(request, limits.max_payload_bytes)
            parsed = parse_request(body, request.headers.get(HEADER_LENGTH))
            prepared = queue.model.prepare(parsed)
            remaining = limits.request_timeout - (time.monotonic() - arrived)
            outputs = await queue.infer(prepared, max(remaining, 0.0))
            content, headers = encode_response(name, parsed, outputs)
        except ProtocolError as problem:
            metrics.errors.labels(label, problem.kind).inc()
            return error(problem.status, str(problem))
        except Exception as fault:  # a bug: this request fails, the server goes on
            log.exception("request to model '%s' failed", name)
            metrics.errors.labels(label, "internal").inc()
            return error(500, f"internal error: {type(fault).__name__}: {fault}")
        finally:
            metrics.latency.labels(label).observe(time.monotonic() - arrived)
        media = "application/octet-stream" if headers else "application/json"
        return Response(content, media_type=media, headers=headers)

    # The hot path as plain Starlette routes, matched first: FastAPI's parameter solving and
    # route scan cost more per request than parsing the request does.  Documented below.
    for path in INFER_PATHS:
        app.router.routes.insert(0, Route(path, infer, methods=["POST"]))

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            for path in INFER_PATHS:
                schema["paths"][path] = {"post": _INFER_OPERATION}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    return app


def _ember_version() -> str:
    try:
        return importlib.metadata.version("ember")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _check_version(name: str, model_version: str) -> None:
    if model_version != "1":
        raise ProtocolError(f"model '{name[:128]}' has one version, '1', not "
                            f"{model_version[:40]!r}", status=404, kind="not_found")


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit`` bytes (from its
    Content-Length, else while it streams in, else as it inflates), decompressed when the
    client sent it gzip- or deflate-encoded (as ``tritonclient`` may)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProtocolError(f"the request body has {int(declared)} bytes, over this server's "
                            f"limit of {limit}", status=413, kind="payload_too_large")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProtocolError(f"the request body exceeds this server's limit of {limit} "
                                f"bytes", status=413, kind="payload_too_large")
        chunks.append(chunk)
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in _WBITS:
        raise ProtocolError(f"Content-Encoding {encoding[:20]!r} is not supported; send gzip, "
                            f"deflate or an uncompressed body")
    return _decompressed(body, _WBITS[encoding], limit)


# zlib's window bits for each Content-Encoding a client may compress a request with
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def _decompressed(body: bytes, wbits: int, limit: int) -> bytes:
    """A compressed body inflated, never past ``limit`` bytes (a small body may inflate to
    gigabytes)."""
    inflater = zlib.decompressobj(wbits)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as error:
        raise ProtocolError(f"the request body does not decompress: {error}") from None
    if len(data) > limit or inflater.unconsumed_tail:
        raise ProtocolError(f"the request body inflates past this server's limit of {limit} "
                            f"bytes", status=413, kind="payload_too_large")
    if not inflater.eof:
        raise ProtocolError("the compressed request body is truncated")
    return data


def describe(models: Sequence[ServedModel], policies: dict[str, BatchPolicy]) -> list[str]:
    """One line per model for the start-up log."""
    lines = []
    for model in models:
        policy = policies.get(model.name, BatchPolicy())
        if not model.batchable:
            batching = "no batching (fixed shapes)"
        elif policy.max_batch == 1:
            batching = "no batching"
        else:
            batching = (f"batches of up to {policy.max_batch} samples, waiting at most "
                        f"{policy.max_queue_delay * 1e3:g} ms")
        if model.block_seconds:
            batching += "; a call of " + ", ".join(
                f"{size}: {seconds * 1e3:.2f} ms" for size, seconds in
                sorted(model.block_seconds.items(), reverse=True))
        lines.append(f"model '{model.name}' from {model.path} (digest {model.digest[:12]}), "
                     f"{len(model.instances)} worker(s), {batching}")
    return lines
