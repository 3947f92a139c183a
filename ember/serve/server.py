"""Running the server: on uvicorn in the foreground (``ember serve``), or in a background
thread on a free localhost port (tests, notebooks).

Shutdown is graceful either way: on SIGINT/SIGTERM (or leaving the ``with`` block) uvicorn
stops accepting connections and waits for the requests in flight, which the app's lifespan
answers -- queued ones included -- before the process exits.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import uvicorn
from fastapi import FastAPI

log = logging.getLogger("ember.serve")


def _config(app: FastAPI, host: str, port: int, log_level: str) -> uvicorn.Config:
    # No uvicorn limit on concurrent connections: the model queues bound the work, and a
    # connection limit below them would cap every batch (ray-project/ray#43288's trap).
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                          lifespan="on", timeout_keep_alive=30)


def run(app: FastAPI, host: str = "127.0.0.1", port: int = 8000,
        log_level: str = "info") -> None:
    """Serve until SIGINT/SIGTERM, then answer every accepted request and return."""
    uvicorn.Server(_config(app, host, port, log_level)).run()


@contextmanager
def serving(app: FastAPI, host: str = "127.0.0.1", log_level: str = "warning",
            start_timeout: float = 30.0) -> Iterator[str]:
    """Serve ``app`` from a background thread on a free port of ``host``; yields the base URL
    (``http://127.0.0.1:PORT``) once the server answers, and shuts it down gracefully on
    exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(_config(app, host, port, log_level))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name="ember-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server did not start within {start_timeout:g} s")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join()
        sock.close()
