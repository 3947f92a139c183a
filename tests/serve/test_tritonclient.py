"""An existing client of the protocol, ``tritonclient``'s HTTP client, against the server:
JSON and binary tensors each way, compressed requests, metadata, health and errors."""

from __future__ import annotations

import gzip
import zlib

import httpx
import numpy as np
import pytest

from served_models import lookup_reference, mlp_reference
from ember.serve import ServedModel, ServerLimits, create_app, serving

import tritonclient.http as tritonhttp
from tritonclient.utils import InferenceServerException

RNG = np.random.default_rng(5)


@pytest.fixture(scope="module")
def client(artifacts):
    models = [ServedModel("mlp", artifacts.mlp), ServedModel("lookup", artifacts.lookup)]
    with serving(create_app(models, limits=ServerLimits(max_payload_bytes=1 << 20))) as url:
        connection = tritonhttp.InferenceServerClient(url=url.removeprefix("http://"))
        yield connection, url
        connection.close()


def _inputs(x: np.ndarray, scale: np.ndarray, binary: bool) -> list:
    inputs = [tritonhttp.InferInput("x", list(x.shape), "FP32"),
              tritonhttp.InferInput("scale", list(scale.shape), "FP32")]
    inputs[0].set_data_from_numpy(x, binary_data=binary)
    inputs[1].set_data_from_numpy(scale, binary_data=not binary)
    return inputs


@pytest.mark.parametrize("binary_in", [True, False])
@pytest.mark.parametrize("binary_out", [True, False])
@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_infer_through_tritonclient(client, binary_in, binary_out, compression):
    connection, _ = client
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    scale = RNG.standard_normal(32).astype(np.float32)
    outputs = [tritonhttp.InferRequestedOutput("z", binary_data=binary_out),
               tritonhttp.InferRequestedOutput("y", binary_data=binary_out)]
    result = connection.infer("mlp", _inputs(x, scale, binary_in), request_id="req-9",
                              outputs=outputs, request_compression_algorithm=compression)
    expected = mlp_reference(x, scale)
    assert result.get_response()["id"] == "req-9"
    for name in ("y", "z"):
        np.testing.assert_allclose(result.as_numpy(name), expected[name], rtol=1e-4,
                                   atol=1e-4)
    # every output when the request names none (tritonclient then asks for binary ones)
    everything = connection.infer("mlp", _inputs(x, scale, binary_in))
    np.testing.assert_allclose(everything.as_numpy("y"), expected["y"], rtol=1e-4, atol=1e-4)


def test_health_metadata_and_errors_through_tritonclient(client):
    connection, _ = client
    assert connection.is_server_live() and connection.is_server_ready()
    assert connection.is_model_ready("lookup") and not connection.is_model_ready("nope")
    metadata = connection.get_model_metadata("lookup")
    assert metadata["inputs"] == [{"name": "idx", "datatype": "INT64", "shape": [-1, 4]}]
    idx = np.array([[0, 9, -1, 3]], np.int64)
    given = tritonhttp.InferInput("idx", [1, 4], "INT64")
    given.set_data_from_numpy(idx)
    np.testing.assert_array_equal(connection.infer("lookup", [given]).as_numpy("rows"),
                                  lookup_reference(idx)["rows"])
    wrong = tritonhttp.InferInput("idx", [1, 4], "INT32")
    wrong.set_data_from_numpy(idx.astype(np.int32))
    with pytest.raises(InferenceServerException) as error:
        connection.infer("lookup", [wrong])
    assert error.value.status() == "400" and "takes INT64" in error.value.message()


def test_a_compressed_body_is_held_to_the_limit_once_inflated(client):
    _, url = client
    bomb = gzip.compress(b"[" + b" " * (4 << 20) + b"]")  # 4 MiB of JSON in a few KiB
    assert len(bomb) < 1 << 20
    response = httpx.post(f"{url}/v2/models/mlp/infer", content=bomb,
                          headers={"Content-Encoding": "gzip"})
    assert response.status_code == 413 and "inflates past" in response.json()["error"]
    truncated = zlib.compress(b'{"inputs": []}')[:-3]
    response = httpx.post(f"{url}/v2/models/mlp/infer", content=truncated,
                          headers={"Content-Encoding": "deflate"})
    assert response.status_code == 400
    response = httpx.post(f"{url}/v2/models/mlp/infer", content=b"{}",
                          headers={"Content-Encoding": "br"})
    assert response.status_code == 400 and "not supported" in response.json()["error"]
