"""The worker's side of a ``cli`` case: run ember's command line on a hostile model and report
what reached stdout and stderr.

In process, ``ember.cli.main`` runs with file descriptors 1 and 2 pointed at temporary files
(so output written by anything -- rich, print, warnings, a C library -- is caught, not only
what goes through ``sys.stdout``); faulthandler meanwhile writes to the worker's log, so a
crash is still attributed.  As a subprocess, ``python -m ember`` runs with pipes.  Either
way as a plain file, or as a terminal (``FORCE_COLOR=1``: rich then adds SGR styles).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

Send = Callable[[dict[str, Any]], None]
SUBPROCESS_TIMEOUT = 50.0
# What must never reach a terminal raw: C0 controls but tab and newline, DEL, C1 controls
# (as characters, or as undecodable bytes 0x80-0x9f), bidirectional formatting characters.
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                         "\u2066-\u2069\udc80-\udc9f]")
# rich's own styling as a terminal: Select Graphic Rendition sequences only.
SGR = re.compile("\x1b\\[[0-9;]*m")
TERMINAL_ENV = {"FORCE_COLOR": "1", "COLUMNS": "120"}
PLAIN_UNSET = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE")


def raw_controls(output: bytes, terminal: bool) -> list[str]:
    """Where ``output`` holds a raw control character (up to 3 places, with context)."""
    text = output.decode("utf-8", "surrogateescape")
    if terminal:
        text = SGR.sub("", text)
    found = []
    for match in RAW_CONTROL.finditer(text):
        start = max(match.start() - 30, 0)
        found.append(f"{match.group()!r} in ...{text[start:match.end() + 30]!r}...")
        if len(found) == 3:
            break
    return found


@contextlib.contextmanager
def captured_output() -> Iterator[dict[str, bytes]]:
    """Point fds 1 and 2 at temporary files for the duration; the dict receives their
    contents ("stdout", "stderr") on exit."""
    result: dict[str, bytes] = {}
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    captures = {fd: tempfile.TemporaryFile() for fd in (1, 2)}
    crash_log = os.fdopen(os.dup(saved[2]), "w")
    faulthandler.enable(file=crash_log, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=crash_log, all_threads=True)
    for fd, capture in captures.items():
        os.dup2(capture.fileno(), fd)
    # Python-level writers too (under pytest, sys.stdout is not fd 1).
    streams = (sys.stdout, sys.stderr)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="strict",
                      closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace",
                      closefd=False)
    try:
        yield result
    finally:
        sys.stdout.close()
        sys.stderr.close()
        sys.stdout, sys.stderr = streams
        for fd in (1, 2):
            os.dup2(saved[fd], fd)
            os.close(saved[fd])
        faulthandler.enable(all_threads=True)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        crash_log.close()
        for name, fd in (("stdout", 1), ("stderr", 2)):
            captures[fd].seek(0)
            result[name] = captures[fd].read()
            captures[fd].close()


@contextlib.contextmanager
def _environment(terminal: bool) -> Iterator[dict[str, str]]:
    """os.environ as a plain file or a terminal wants it (restored on exit)."""
    saved = dict(os.environ)
    for name in PLAIN_UNSET:
        os.environ.pop(name, None)
    if terminal:
        os.environ.update(TERMINAL_ENV)
    try:
        yield dict(os.environ)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _in_process(argv: list[str], terminal: bool) -> dict[str, Any]:
    from ember.cli import main

    from fuzz.worker import describe_exception

    outcome: dict[str, Any] = {}
    with _environment(terminal), captured_output() as streams:
        try:
            outcome["status"] = main(argv)
        except BaseException as error:  # noqa: BLE001 -- main() must not let anything out
            outcome["status"] = None
            outcome["error"] = describe_exception(error)
    outcome.update(streams)
    if outcome["status"] == 1 and "error" not in outcome:
        # An internal error: run again with --traceback to learn what raised where.
        with _environment(terminal), captured_output():
            try:
                main(["--traceback", *argv])
            except Exception as error:  # noqa: BLE001
                outcome["error"] = describe_exception(error)
    return outcome


def _subprocess(argv: list[str], terminal: bool, cwd: Path) -> dict[str, Any]:
    with _environment(terminal) as env:
        try:
            done = subprocess.run([sys.executable, "-m", "ember", *argv], cwd=cwd, env=env,
                                  capture_output=True, timeout=SUBPROCESS_TIMEOUT,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as expired:
            return {"status": None, "timeout": True, "stdout": expired.stdout or b"",
                    "stderr": expired.stderr or b""}
    return {"status": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def run_cli_case(request: dict[str, Any], send: Send) -> None:
    """Write the model, run each command line, report its status, streams and leaks."""
    with tempfile.TemporaryDirectory(prefix="ember-fuzz-cli-") as scratch:
        root = Path(scratch)
        out = root / "out"
        out.mkdir()
        model = os.path.join(os.fsencode(root), os.fsencode(request["file_name"]))
        with open(model, "wb") as handle:
            handle.write(request["data"])
        model_arg = os.fsdecode(model)
        for index, command in enumerate(request["commands"]):
            argv = [part.replace("{model}", model_arg).replace("{out}", str(out))
                    for part in command]
            send({"event": "phase", "phase": f"cli: ember {command[0]} ({index + 1})"})
            if request["mode"] == "subprocess":
                outcome = _subprocess(argv, request["terminal"], root)
            else:
                outcome = _in_process(argv, request["terminal"])
            leaks = {stream: raw_controls(outcome[stream], request["terminal"])
                     for stream in ("stdout", "stderr")}
            send({"event": "cli", "command": " ".join(command), "status": outcome["status"],
                  "error": outcome.get("error"), "timeout": outcome.get("timeout", False),
                  "leaks": {k: v for k, v in leaks.items() if v},
                  "stderr_tail": outcome["stderr"][-600:].decode("utf-8", "replace")})
