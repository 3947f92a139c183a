"""The wire format between the fuzz session and its worker processes.

Messages are pickled dicts, each preceded by its length (8 bytes, little-endian), over plain
pipes.  The worker reports *events* while a case runs -- the phase it enters, ember's outcome,
the oracle's -- rather than one answer at the end, so that when it dies or hangs the session
still knows how far the case got (a crash while the oracle runs is not ember's crash).
Pickle is fine here: both ends are this package, on one machine.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import time
from typing import Any, BinaryIO

HEADER = struct.Struct("<Q")


def write_message(stream: BinaryIO, message: dict[str, Any]) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(payload)) + payload)
    stream.flush()


def read_message(stream: BinaryIO) -> dict[str, Any] | None:
    """The next message, or None at end of stream (blocking; used by the worker)."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (size,) = HEADER.unpack(header)
    payload = stream.read(size)
    if len(payload) < size:
        return None
    return pickle.loads(payload)


class Timeout(Exception):
    """No complete message arrived before the deadline."""


class MessageReader:
    """Reads messages from a pipe file descriptor with a deadline (used by the session, which
    must never block forever on a worker that hangs)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buffer = bytearray()

    def read(self, deadline: float) -> dict[str, Any] | None:
        """The next message; None if the worker closed the pipe (it died); Timeout if
        ``deadline`` (a ``time.monotonic()`` value) passes first."""
        while True:
            message = self._complete_message()
            if message is not None:
                return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Timeout()
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                raise Timeout()
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                return None
            self.buffer += chunk

    def _complete_message(self) -> dict[str, Any] | None:
        if len(self.buffer) < HEADER.size:
            return None
        (size,) = HEADER.unpack(self.buffer[:HEADER.size])
        if len(self.buffer) < HEADER.size + size:
            return None
        payload = bytes(self.buffer[HEADER.size:HEADER.size + size])
        del self.buffer[:HEADER.size + size]
        return pickle.loads(payload)
