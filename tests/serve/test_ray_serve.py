"""``ember serve --replicas 2``: the same server as a Ray Serve deployment on a local Ray
instance, started in a process of its own (Ray's processes stay out of the test process and
are all stopped with it)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from served_models import lookup_reference, mlp_reference

RNG = np.random.default_rng(3)
START_SECONDS = 180


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(artifacts) -> tuple[str, subprocess.Popen] | str:
    """``ember serve --replicas 2`` on a free port: its URL and process once ready, or what
    it printed when it exited first."""
    port = _free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # no token file in the home directory
    process = subprocess.Popen(
        [sys.executable, "-m", "ember", "serve", f"mlp={artifacts.mlp}",
         f"lookup={artifacts.lookup}", "--replicas", "2", "--port", str(port),
         "--max-batch", "8"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=5).status_code == 200:
                return url, process
        except httpx.TransportError:
            pass
        if process.poll() is not None:
            return process.stdout.read()
        time.sleep(0.5)
    _stop(process)
    return "Ray Serve did not start in time"


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=90)
    finally:
        try:  # Ray's agents may outlive the driver: the whole session goes
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def ray_server(artifacts):
    # The port is chosen before Ray binds it, and Ray starts several processes of its own:
    # on a busy machine something else can take the port first, so a second attempt.
    failures = []
    for _ in range(2):
        started = _start(artifacts)
        if not isinstance(started, str):
            break
        failures.append(started)
    else:
        pytest.fail("ember serve --replicas 2 did not start:\n" + "\n---\n".join(failures))
    try:
        yield started
    finally:
        _stop(started[1])


def _request(i: int, inputs: dict[str, np.ndarray]) -> dict:
    types = {"float32": "FP32", "int64": "INT64"}
    return {"id": f"r{i}", "inputs": [
        {"name": name, "shape": list(value.shape), "datatype": types[value.dtype.name],
         "data": value.ravel().tolist()} for name, value in inputs.items()]}


def test_replicas_on_ray_serve_answer_every_request_with_its_own_result(ray_server):
    url, _ = ray_server
    cases = []
    for i in range(48):
        if i % 3:
            x = RNG.standard_normal((1 + i % 4, 16)).astype(np.float32)
            scale = np.full(32, 1.0 + i % 2, np.float32)
            cases.append(("mlp", {"x": x, "scale": scale}, mlp_reference(x, scale)))
        else:
            idx = RNG.integers(0, 10, (2, 4))
            cases.append(("lookup", {"idx": idx}, lookup_reference(idx)))

    async def send_all():
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await asyncio.gather(*(
                client.post(f"/v2/models/{model}/infer", json=_request(i, inputs))
                for i, (model, inputs, _) in enumerate(cases)))

    for i, ((model, _, expected), response) in enumerate(zip(cases, asyncio.run(send_all()))):
        assert response.status_code == 200, response.text
        document = response.json()
        assert document["id"] == f"r{i}" and document["model_name"] == model
        for entry in document["outputs"]:
            np.testing.assert_allclose(
                np.array(entry["data"], np.float32).reshape(entry["shape"]),
                expected[entry["name"]], rtol=1e-4, atol=1e-4)


def test_the_same_protocol_errors_and_metrics_through_ray(ray_server):
    url, _ = ray_server
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/v2/models/mlp").json()["inputs"][0]["shape"] == [-1, 16]
        missing = client.post("/v2/models/nope/infer", json={"inputs": []})
        assert missing.status_code == 404 and "mlp" in missing.json()["error"]
        bad = client.post("/v2/models/lookup/infer",
                          json=_request(0, {"idx": np.array([[0, 1, 2, 99]])}))
        assert bad.status_code == 400 and "index out of range" in bad.json()["error"]
        assert "ember_requests_total" in client.get("/metrics").text


def test_sigterm_takes_the_deployment_down(ray_server):
    url, process = ray_server
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=90) == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/v2/health/live", timeout=5)
