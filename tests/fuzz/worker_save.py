"""The worker's side of a ``save`` case: lay out a target, save an artifact into it, and
report what changed on disk and whether the artifact runs as the module does.

Which files are ember's is decided by who wrote them: the previous artifacts the case asks
for are saved by ember itself before the user's extras are added, and only the entries
they consist of may change or disappear.  Every other entry in the scratch directory --
user files, the directories and links around the target, what a link points to -- must be
exactly as it was (kind, bytes, link target, permission bits); new entries may appear only
at or under the target (and as parent directories of a target that did not exist).
"""

from __future__ import annotations

import inspect
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from fuzz.layout import make_writable, materialize, snapshot, under

Send = Callable[[dict[str, Any]], None]


def _compile(data: bytes, input_shapes: dict | None):
    import ember

    return ember.compile(data, input_shapes=input_shapes) if input_shapes else \
        ember.compile(data)


def _changes(before: dict, after: dict, ember_paths: set[bytes], target: bytes,
             succeeded: bool, resolved: bytes | None = None) -> tuple[list[str], list[str]]:
    """(entries ember must not have touched that changed, entries left outside the
    target).  ``resolved``: where the target really is, when a symbolic link on its
    parent path leads elsewhere in the scratch directory (the user chose that path)."""
    damaged = []
    for path, (kind, content, mode) in sorted(before.items()):
        if path in ember_paths:
            continue
        now = after.get(path)
        if now is None:
            damaged.append(f"deleted {path!r} ({kind})")
        elif now[0] != kind:
            damaged.append(f"{path!r} was a {kind}, is a {now[0]}")
        elif kind == "dir":
            # The target directory itself is replaced by the new artifact's (mode included).
            if now[2] != mode and not (succeeded and path == target):
                damaged.append(f"{path!r} mode {oct(mode)} -> {oct(now[2])}")
        elif now[1] != content:
            damaged.append(f"{path!r} ({kind}) content changed")
        elif now[2] != mode:
            damaged.append(f"{path!r} mode {oct(mode)} -> {oct(now[2])}")
    ancestors = set()
    parent = os.path.dirname(target)
    while parent:
        ancestors.add(parent)
        parent = os.path.dirname(parent)
    targets = [target] + ([resolved] if resolved else [])
    stray = [f"{path!r}" for path in sorted(set(after) - set(before))
             if not ((succeeded and any(under(path, t) for t in targets))
                     or path in ancestors)]
    return damaged[:10], stray[:10]


def _resolved(root: Path, target: Path) -> bytes | None:
    """The target's path relative to ``root`` once the links on its parent path are
    followed (None if that leaves the scratch directory or the parent does not exist)."""
    parent = os.path.realpath(target.parent)
    real_root = os.path.realpath(root)
    if not os.path.isdir(parent) or os.path.commonpath([parent, real_root]) != real_root:
        return None
    return os.fsencode(os.path.relpath(os.path.join(parent, target.name), real_root))


def run_save_case(request: dict[str, Any], send: Send) -> None:
    import ember
    import ember.runtime

    from fuzz.worker import bitwise_mismatch, describe_exception
    from fuzz.worker_cli import captured_output

    with tempfile.TemporaryDirectory(prefix="ember-fuzz-save-") as scratch:
        root = Path(scratch)
        try:
            materialize(request["layout"], root)
            module = _compile(request["data"], request["input_shapes"])
            expected = module.run(request["feeds"])
            ember_paths: set[bytes] = set()
            if request["previous"]:
                previous = _compile(request["previous_data"], request["input_shapes"])
                previous.run(request["feeds"])
                for where in request["previous"]:
                    previous.save(root / where)
                    ember_paths |= {os.path.join(os.fsencode(where), p)
                                    for p in snapshot(root / where)} | {os.fsencode(where)}
            materialize(request["extras"], root)
            before = snapshot(root)
        except Exception as error:
            make_writable(root)
            send({"event": "harness-error", "error": describe_exception(error)})
            return
        target = root / request["target"]
        send({"event": "phase", "phase": f"save ({request['entry']})"})
        outcome: dict[str, Any] = {"event": "save", "status": "ok"}
        try:
            if request["entry"] == "cli":
                from ember.cli import main

                model_path = root / "model.onnx"
                model_path.write_bytes(request["data"])
                before[b"model.onnx"] = ("file", request["data"], model_path.stat().st_mode
                                         & 0o7777)
                with captured_output() as streams:
                    status = main(["compile", str(model_path), "-o", str(target),
                                   *request["cli_args"]])
                outcome["stderr_tail"] = streams["stderr"][-400:].decode("utf-8", "replace")
                if status == 2:
                    outcome["status"] = "ember-error"
                elif status != 0:
                    outcome["status"] = "exception"
                    outcome["error"] = {"type": f"exit status {status}",
                                        "message": outcome["stderr_tail"][-300:],
                                        "origin": "ember compile"}
            else:
                options = {}
                if request["overwrite"] is not None and \
                        "overwrite" in inspect.signature(module.save).parameters:
                    options["overwrite"] = request["overwrite"]
                module.save(target, **options)
        except ember.EmberError as error:
            outcome.update(status="ember-error", error=describe_exception(error))
        except Exception as error:
            outcome.update(status="exception", error=describe_exception(error))
        succeeded = outcome["status"] == "ok"
        after = snapshot(root)
        damaged, stray = _changes(before, after, ember_paths,
                                  os.fsencode(request["target"]), succeeded,
                                  _resolved(root, target))
        outcome.update(damaged=damaged, stray=stray)
        if succeeded and (target.is_symlink() or not target.is_dir()):
            what = "a symbolic link" if target.is_symlink() else "not a directory"
            outcome["not_artifact"] = f"the target is {what} after the save"
        send(outcome)
        if succeeded and "not_artifact" not in outcome:
            for name, load in {"ember.runtime.load": ember.runtime.load,
                               "ember.load": ember.load}.items():
                send({"event": "phase", "phase": f"{name} (saved artifact)"})
                try:
                    outputs = load(target).run(request["feeds"])
                    send({"event": "loader", "loader": name, "status": "ok",
                          "mismatch": bitwise_mismatch(outputs, expected)})
                except ember.EmberError as error:
                    send({"event": "loader", "loader": name, "status": "ember-error",
                          "error": describe_exception(error)})
                except Exception as error:
                    send({"event": "loader", "loader": name, "status": "exception",
                          "error": describe_exception(error)})
        make_writable(root)
