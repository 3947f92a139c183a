"""The server end to end: a real uvicorn on a free localhost port, real artifacts, real
HTTP clients.  Every answer is checked against the numpy references of ``conftest.py`` by the
request's id, every error by its status and by what its message names."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import httpx
import numpy as np
import pytest

from served_models import fixed_reference, lookup_reference, mlp_reference
from ember.serve import BatchPolicy, ServedModel, ServerLimits, create_app, serving

RNG = np.random.default_rng(11)
PAYLOAD_LIMIT = 256 << 10


@pytest.fixture(scope="module")
def server(artifacts):
    models = [ServedModel("mlp", artifacts.mlp, workers=2), ServedModel("lookup", artifacts.lookup),
              ServedModel("fixed", artifacts.fixed)]
    policies = {"mlp": BatchPolicy(max_batch=8, max_queue_delay=0.001)}
    app = create_app(models, policies, ServerLimits(max_payload_bytes=PAYLOAD_LIMIT))
    with serving(app) as url:
        yield url


def _tensor(name: str, array: np.ndarray, binary: bool = False) -> tuple[dict, bytes]:
    datatype = {"float32": "FP32", "int64": "INT64"}[array.dtype.name]
    entry = {"name": name, "shape": list(array.shape), "datatype": datatype}
    if binary:
        entry["parameters"] = {"binary_data_size": array.nbytes}
        return entry, array.tobytes()
    entry["data"] = array.tolist()  # nested lists: the protocol takes them as well as flat
    return entry, b""


def _body(inputs: dict[str, np.ndarray], request_id: str | None = None, binary: bool = False,
          binary_outputs: bool = False) -> tuple[bytes, dict[str, str]]:
    entries, chunks = zip(*(_tensor(name, value, binary) for name, value in inputs.items()))
    document = {"inputs": list(entries)}
    if request_id is not None:
        document["id"] = request_id
    if binary_outputs:
        document["parameters"] = {"binary_data_output": True}
    header = json.dumps(document).encode()
    headers = {"Content-Type": "application/json"}
    if binary:
        headers["Inference-Header-Content-Length"] = str(len(header))
    return header + b"".join(chunks), headers


def _outputs(response: httpx.Response) -> tuple[dict, dict[str, np.ndarray]]:
    """The response document and its outputs as arrays (JSON or binary)."""
    body = response.content
    length = response.headers.get("inference-header-content-length")
    header, binary = (body, b"") if length is None else (body[:int(length)], body[int(length):])
    document = json.loads(header)
    dtypes = {"FP32": np.float32, "INT64": np.int64}
    arrays, offset = {}, 0
    for entry in document["outputs"]:
        dtype = dtypes[entry["datatype"]]
        if "data" in entry:
            arrays[entry["name"]] = np.array(entry["data"], dtype).reshape(entry["shape"])
        else:
            size = entry["parameters"]["binary_data_size"]
            arrays[entry["name"]] = np.frombuffer(binary[offset:offset + size],
                                                  dtype).reshape(entry["shape"])
            offset += size
    assert offset == len(binary)
    return document, arrays


def _close(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert set(actual) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=1e-4, atol=1e-4, err_msg=name)


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the Prometheus text ``text``."""
    for line in text.splitlines():
        match = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if not match or match[1] != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match[2] or ""))
        if all(found.get(key) == value for key, value in labels.items()):
            return float(match[3])
    return 0.0


def test_health_metadata_and_the_api_page(server):
    with httpx.Client(base_url=server) as client:
        assert client.get("/v2/health/live").status_code == 200
        assert client.get("/v2/health/ready").status_code == 200
        assert client.get("/v2").json()["name"] == "ember"
        assert client.get("/v2/models/mlp/ready").status_code == 200
        meta = client.get("/v2/models/mlp").json()
        assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 16]},
                                  {"name": "scale", "datatype": "FP32", "shape": [32]}]
        assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 32]},
                                   {"name": "z", "datatype": "FP32", "shape": [-1, 16]}]
        assert client.get("/v2/models/fixed/versions/1").json()["inputs"] == [
            {"name": "x", "datatype": "FP32", "shape": [2, 8]}]
        missing = client.get("/v2/models/nope")
        assert missing.status_code == 404 and "mlp" in missing.json()["error"]
        assert client.get("/v2/models/mlp/versions/2").status_code == 404
        assert client.get("/openapi.json").json()["paths"]["/v2/models/{name}/infer"]
        assert client.get("/docs").status_code == 200


def test_concurrent_requests_of_mixed_shapes_each_get_their_own_answer(server):
    """64 requests at once to three models: batch sizes 1..5, two values of the shared input
    (so two batch keys), JSON and binary tensors, JSON and binary outputs."""
    scales = [RNG.standard_normal(32).astype(np.float32) for _ in range(2)]
    cases = []
    for i in range(64):
        kind = i % 4
        if kind in (0, 1):
            x = RNG.standard_normal((1 + i % 5, 16)).astype(np.float32)
            inputs = {"x": x, "scale": scales[i % 2]}
            cases.append(("mlp", inputs, mlp_reference(x, scales[i % 2])))
        elif kind == 2:
            idx = RNG.integers(-10, 10, (1 + i % 3, 4))
            cases.append(("lookup", {"idx": idx}, lookup_reference(idx)))
        else:
            x = RNG.standard_normal((2, 8)).astype(np.float32)
            cases.append(("fixed", {"x": x}, fixed_reference(x)))

    async def send_all():
        async with httpx.AsyncClient(base_url=server, timeout=60) as client:
            async def send(i, model, inputs):
                body, headers = _body(inputs, f"r{i}", binary=i % 3 == 0,
                                      binary_outputs=i % 5 == 0)
                return await client.post(f"/v2/models/{model}/infer", content=body,
                                         headers=headers)
            return await asyncio.gather(*(send(i, model, inputs)
                                          for i, (model, inputs, _) in enumerate(cases)))

    responses = asyncio.run(send_all())
    for i, ((model, _, expected), response) in enumerate(zip(cases, responses)):
        assert response.status_code == 200, response.text
        document, arrays = _outputs(response)
        assert document["id"] == f"r{i}" and document["model_name"] == model
        _close(arrays, expected)
    metrics = httpx.get(f"{server}/metrics").text
    assert _metric(metrics, "ember_batch_requests_count", model="mlp") >= 1
    assert _metric(metrics, "ember_requests_total", model="mlp") >= 32


def test_requested_outputs_only(server):
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    scale = np.ones(32, np.float32)
    body = {"inputs": [_tensor("x", x)[0], _tensor("scale", scale)[0]],
            "outputs": [{"name": "z", "parameters": {"binary_data": True}}]}
    response = httpx.post(f"{server}/v2/models/mlp/infer", json=body)
    document, arrays = _outputs(response)
    assert [entry["name"] for entry in document["outputs"]] == ["z"]
    _close(arrays, {"z": mlp_reference(x, scale)["z"]})


@pytest.mark.parametrize("body, status, named", [
    (b'{"inputs": [', 400, "not valid JSON"),
    (b'[1, 2]', 400, "JSON object"),
    (json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                             "data": [0.0] * 16}]}).encode(), 400, "'scale'"),
    (json.dumps({"inputs": [{"name": "x", "shape": [1, 15], "datatype": "FP32",
                             "data": [0.0] * 15},
                            {"name": "scale", "shape": [32], "datatype": "FP32",
                             "data": [1.0] * 32}]}).encode(), 400, "[N, 16]"),
    (json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "INT64",
                             "data": [0] * 16},
                            {"name": "scale", "shape": [32], "datatype": "FP32",
                             "data": [1.0] * 32}]}).encode(), 400, "takes FP32"),
    (json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                             "data": [0.0] * 15}]}).encode(), 400, "holds 15 elements"),
    (json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                             "data": ["a"] * 16}]}).encode(), 400, "not a number"),
    (json.dumps({"inputs": [{"name": "w", "shape": [1], "datatype": "FP32",
                             "data": [0.0]}]}).encode(), 400, "no input(s) ['w']"),
    (json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP99",
                             "data": [0.0]}]}).encode(), 400, "FP99"),
    (json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                             "data": [0.0] * 16},
                            {"name": "scale", "shape": [32], "datatype": "FP32",
                             "data": [1.0] * 32}],
                 "outputs": [{"name": "q"}]}).encode(), 400, "no output(s) ['q']"),
    (b"x" * (PAYLOAD_LIMIT + 1), 413, "limit"),
])
def test_a_bad_request_gets_a_clear_error_and_the_server_goes_on(server, body, status, named):
    response = httpx.post(f"{server}/v2/models/mlp/infer", content=body,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == status
    assert named in response.json()["error"]
    x = RNG.standard_normal((1, 16)).astype(np.float32)
    scale = np.ones(32, np.float32)
    good, headers = _body({"x": x, "scale": scale})
    _close(_outputs(httpx.post(f"{server}/v2/models/mlp/infer", content=good,
                               headers=headers))[1], mlp_reference(x, scale))


def test_binary_data_that_does_not_add_up_is_refused(server):
    x = RNG.standard_normal((1, 16)).astype(np.float32)
    body, headers = _body({"x": x, "scale": np.ones(32, np.float32)}, binary=True)
    short = httpx.post(f"{server}/v2/models/mlp/infer", content=body[:-4], headers=headers)
    assert short.status_code == 400 and "past the end" in short.json()["error"]
    extra = httpx.post(f"{server}/v2/models/mlp/infer", content=body + b"1234", headers=headers)
    assert extra.status_code == 400 and "add up to" in extra.json()["error"]


def test_an_index_out_of_range_fails_its_own_request_only(server):
    """Concurrent lookups, some with an index past the table: those get a 400 naming the
    input, every other one its rows (joined calls that fail are rerun request by request)."""
    cases = []
    for i in range(24):
        idx = RNG.integers(0, 10, (2, 4))
        if i % 6 == 0:
            idx[1, 2] = 10 + i
        cases.append(idx)

    async def send_all():
        async with httpx.AsyncClient(base_url=server, timeout=60) as client:
            return await asyncio.gather(*(
                client.post("/v2/models/lookup/infer", content=_body({"idx": idx})[0])
                for idx in cases))

    for i, (idx, response) in enumerate(zip(cases, asyncio.run(send_all()))):
        if i % 6 == 0:
            assert response.status_code == 400
            assert "index out of range" in response.json()["error"]
            assert "'idx'" in response.json()["error"]
        else:
            assert response.status_code == 200, response.text
            _close(_outputs(response)[1], lookup_reference(idx))


def test_metrics_count_requests_errors_and_batches(artifacts):
    app = create_app([ServedModel("mlp", artifacts.mlp)], {"mlp": BatchPolicy(max_batch=4)})
    with serving(app) as url, httpx.Client(base_url=url) as client:
        scale = np.ones(32, np.float32)
        for size in (1, 2, 3):
            body, headers = _body({"x": np.ones((size, 16), np.float32), "scale": scale})
            assert client.post("/v2/models/mlp/infer", content=body,
                               headers=headers).status_code == 200
        assert client.post("/v2/models/mlp/infer", content=b"{").status_code == 400
        assert client.post("/v2/models/other/infer", content=b"{}").status_code == 404
        text = client.get("/metrics").text
    assert _metric(text, "ember_requests_total", model="mlp") == 4
    assert _metric(text, "ember_request_errors_total", model="mlp", kind="bad_request") == 1
    assert _metric(text, "ember_request_errors_total", model="(unknown)",
                   kind="not_found") == 1
    assert _metric(text, "ember_batch_size_sum", model="mlp") == 6  # samples run
    assert _metric(text, "ember_batch_size_count", model="mlp") == 3
    assert _metric(text, "ember_request_latency_seconds_count", model="mlp") == 4
    assert _metric(text, "ember_queue_delay_seconds_count", model="mlp") == 3
    assert _metric(text, "ember_queue_depth", model="mlp") == 0


def _slowed(model: ServedModel, seconds: float) -> ServedModel:
    """``model`` with every call taking at least ``seconds``: queues fill up on any machine."""
    run_batch = model.run_batch

    def slow(worker, batch):
        time.sleep(seconds)
        return run_batch(worker, batch)

    model.run_batch = slow
    return model


def _send_concurrently(url: str, bodies: list[bytes], started: threading.Event | None = None
                       ) -> list[httpx.Response]:
    async def send_all():
        async with httpx.AsyncClient(base_url=url, timeout=60,
                                     limits=httpx.Limits(max_connections=None)) as client:
            async def send(body):
                response = await client.post("/v2/models/mlp/infer", content=body)
                if started is not None:
                    started.set()
                return response
            return await asyncio.gather(*(send(body) for body in bodies))
    return asyncio.run(send_all())


def test_overload_gets_every_request_its_result_or_a_clean_429(artifacts):
    """32 requests at once against a queue of 4: each is answered, with its own result or a
    429; none lost or mixed up."""
    model = _slowed(ServedModel("mlp", artifacts.mlp), 0.02)
    app = create_app([model], {"mlp": BatchPolicy(max_batch=2, max_queue=4)})
    scale = np.ones(32, np.float32)
    xs = [RNG.standard_normal((1, 16)).astype(np.float32) for _ in range(32)]
    bodies = [_body({"x": x, "scale": scale}, f"r{i}")[0] for i, x in enumerate(xs)]
    with serving(app) as url:
        responses = _send_concurrently(url, bodies)
        text = httpx.get(f"{url}/metrics").text
    statuses = [response.status_code for response in responses]
    assert set(statuses) <= {200, 429} and statuses.count(429) >= 16, statuses
    for i, (x, response) in enumerate(zip(xs, responses)):
        if response.status_code == 429:
            assert "queued" in response.json()["error"]
            continue
        document, arrays = _outputs(response)
        assert document["id"] == f"r{i}"
        _close(arrays, mlp_reference(x, scale))
    assert _metric(text, "ember_request_errors_total", model="mlp",
                   kind="queue_full") == statuses.count(429)


def test_shutdown_answers_every_accepted_request(artifacts):
    """Leaving ``serving`` (what SIGTERM does to ``ember serve``) while 16 requests are queued
    or running: each still gets its result."""
    model = _slowed(ServedModel("mlp", artifacts.mlp), 0.03)
    app = create_app([model], {"mlp": BatchPolicy(max_batch=1)})
    scale = np.ones(32, np.float32)
    xs = [RNG.standard_normal((1, 16)).astype(np.float32) for _ in range(16)]
    bodies = [_body({"x": x, "scale": scale}, f"r{i}")[0] for i, x in enumerate(xs)]
    first_answer = threading.Event()
    results: list[httpx.Response] = []
    with serving(app) as url:
        sender = threading.Thread(
            target=lambda: results.extend(_send_concurrently(url, bodies, first_answer)))
        sender.start()
        assert first_answer.wait(30)
        # leaving the block shuts the server down with 15 requests still queued
    sender.join(60)
    assert len(results) == 16
    for i, (x, response) in enumerate(zip(xs, results)):
        assert response.status_code == 200, response.text
        document, arrays = _outputs(response)
        assert document["id"] == f"r{i}"
        _close(arrays, mlp_reference(x, scale))


def _prepared(model: ServedModel, x: np.ndarray, scale: np.ndarray):
    from ember.serve.protocol import InferRequest

    return model.prepare(InferRequest(None, {"x": x, "scale": scale}))


def test_padding_a_batch_to_a_block_is_chosen_by_the_blocks_call_times(artifacts):
    model = ServedModel("mlp", artifacts.mlp)  # blocks of 4 and 1
    assert sorted(model.block_seconds) == [1, 4]
    assert all(seconds > 0 for seconds in model.block_seconds.values())
    model.block_seconds = {4: 1.0, 1: 1.0}  # a call costs the same at any size: pad
    assert [model.padded_size(n) for n in (1, 2, 3, 4, 5, 7, 9)] == [1, 4, 4, 4, 5, 8, 9]
    model.block_seconds = {4: 4.0, 1: 1.0}  # every sample costs the same: never pad
    assert [model.padded_size(n) for n in (2, 3, 7)] == [2, 3, 7]
    model.block_seconds = {4: 2.5, 1: 1.0}  # pad 3 (2.5 < 0.9 x 3.0), not 2 (2.5 > 2.0)
    assert [model.padded_size(n) for n in (2, 3)] == [2, 4]


def test_a_padded_batch_answers_each_request_with_its_own_rows_only(artifacts):
    model = ServedModel("mlp", artifacts.mlp, time_blocks=False)
    model.block_seconds = {4: 1.0, 1: 1.0}
    scale = RNG.standard_normal(32).astype(np.float32)
    xs = [RNG.standard_normal((size, 16)).astype(np.float32) for size in (1, 2)]
    results = model.run_batch(0, [_prepared(model, x, scale) for x in xs])  # 3 -> 4
    for x, result in zip(xs, results):
        _close(result, mlp_reference(x, scale))
    lone = RNG.standard_normal((6, 16)).astype(np.float32)  # 4 + 2 -> 4 + 4
    _close(model.run_batch(0, [_prepared(model, lone, scale)])[0], mlp_reference(lone, scale))


def test_outputs_with_the_batch_second_are_split_along_it(tmp_path):
    """A batch output whose batch is its second axis (a recurrent layer's final states) is
    cut per request along that axis, and its metadata marks that axis -1."""
    import onnx
    from onnx import TensorProto, helper

    import ember
    from ember.serve.protocol import InferRequest

    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
         helper.make_node("Relu", ["x"], ["r"])], "moved",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 3])],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4, "N", 3]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 4, 3])])
    module = ember.compile(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    module(np.zeros((4, 4, 3), np.float32))
    model = ServedModel("moved", module.save(tmp_path / "moved.ember"))
    assert [o["shape"] for o in model.metadata()["outputs"]] == [[4, -1, 3], [-1, 4, 3]]
    xs = [RNG.standard_normal((size, 4, 3)).astype(np.float32) for size in (1, 3, 2)]
    prepared = [model.prepare(InferRequest(None, {"x": x})) for x in xs]
    for x, result in zip(xs, model.run_batch(0, prepared)):
        np.testing.assert_array_equal(result["t"], x.transpose(1, 0, 2))
        np.testing.assert_array_equal(result["r"], np.maximum(x, 0))
