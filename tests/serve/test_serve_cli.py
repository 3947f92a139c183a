"""``ember serve`` on the command line: a real process, stopped with SIGTERM; and the errors
of a wrong command line (exit status 2 with one clear message)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from served_models import mlp_reference
from ember.cli import main


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_ember_serve_serves_and_stops_cleanly_on_sigterm(artifacts):
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "ember", "serve", f"mlp={artifacts.mlp}", str(artifacts.fixed),
         "--port", str(port), "--max-batch", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/v2/health/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
        scale = np.full(32, 0.5, np.float32)
        response = httpx.post(f"{url}/v2/models/mlp/infer", json={"inputs": [
            {"name": "x", "shape": [2, 16], "datatype": "FP32", "data": x.ravel().tolist()},
            {"name": "scale", "shape": [32], "datatype": "FP32", "data": scale.tolist()}]})
        assert response.status_code == 200
        y = np.array(response.json()["outputs"][0]["data"], np.float32).reshape(2, 32)
        np.testing.assert_allclose(y, mlp_reference(x, scale)["y"], rtol=1e-4, atol=1e-4)
        # the second model is named after its directory
        assert httpx.get(f"{url}/v2/models/fixed").status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    # uvicorn shuts down gracefully, then re-raises the signal for the exit status
    assert process.returncode in (0, -signal.SIGTERM), output
    assert "Application shutdown complete" in output
    assert "model 'mlp'" in output and "batches of up to 4 samples" in output
    assert "model 'fixed'" in output and "no batching (fixed shapes)" in output


@pytest.mark.parametrize("arguments, message", [
    (["mlp={mlp}", "--digest", "mlp=" + "0" * 64], "not the expected one"),
    (["mlp={mlp}", "--digest", "other=" + "0" * 64], "not served"),
    (["bad/name={mlp}"], "not usable in a URL"),
    (["a={mlp}", "a={fixed}"], "two models are named ['a']"),
    (["{missing}"], "missing"),
    (["mlp={mlp}", "--max-queue-delay-ms", "-1"], "--max-queue-delay-ms"),
])
def test_a_wrong_command_line_is_one_clear_error(artifacts, tmp_path, capsys, arguments,
                                                 message):
    paths = {"mlp": artifacts.mlp, "fixed": artifacts.fixed, "missing": tmp_path / "missing"}
    argv = ["serve", *(argument.format(**paths) for argument in arguments)]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error, error
