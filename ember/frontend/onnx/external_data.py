"""Reading the external tensor data of an ONNX model, confined to the model's own directory.

An ONNX tensor may keep its bytes in another file (``data_location = EXTERNAL``, with a
``location`` relative to the model file, an ``offset`` and a ``length``).  The location is
text from the model, so it is untrusted: ``id_rsa``, ``../../etc/shadow``, a symbolic link
out of the directory, a FIFO that blocks forever, ``/dev/zero``.  Left to
``onnx.numpy_helper``, a tensor of a model given as bytes or as a ``ModelProto`` is read
relative to the process's working directory -- a model that turns a private file into a
weight, then an output, then part of a saved artifact.

So ember reads external data itself, before anything else looks at a tensor:

* only relative to a directory the caller named: the model file's own directory, or the
  ``base_dir=`` given with bytes or a proto (without one, such a model is refused, naming
  the tensor and its file);
* each path component is opened relative to the directory before it, without following a
  symbolic link, so nothing outside the directory can be reached; the file must be a regular
  file (``O_NONBLOCK``: a FIFO does not block) holding the bytes the tensor's shape and type
  need, at the given offset;
* the bytes read in all are bounded by the memory budget.

Every tensor is visited: initializers, the values and indices of sparse initializers, the
tensors of node attributes, in subgraphs and in model-local functions.
"""

from __future__ import annotations

import errno
import math
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from ember.core.errors import ModelLoadError
from ember.core.config import format_size, memory_limit as resolve_memory_limit

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_READ_CHUNK = 1 << 24


def has_external_data(proto: Any) -> bool:
    """Whether any tensor of the model keeps its data in another file."""
    return any(True for _ in external_tensors(proto))


def external_tensors(proto: Any) -> Iterator[tuple[Any, str]]:
    """(tensor, where) for every TensorProto of the model whose data is external."""
    from onnx import TensorProto

    for tensor, where in _all_tensors(proto):
        if tensor.data_location == TensorProto.EXTERNAL:
            yield tensor, where


def load_external_data(proto: Any, base_dir: str | os.PathLike[str] | None, model: str,
                       memory_limit: int | str | None = None) -> None:
    """Read every external tensor of ``proto`` into it (``raw_data``), from files inside
    ``base_dir``; ``model`` names the model in messages; at most ``memory_limit`` bytes in all
    (default: ember's memory budget).  A model with external tensors and no ``base_dir`` is
    refused."""
    from onnx import TensorProto

    tensors = list(external_tensors(proto))
    if not tensors:
        return
    if base_dir is None:
        tensor, where = tensors[0]
        location = _entries(tensor, where).get("location", "?")
        raise ModelLoadError(
            f"{model}: {where} keeps its data in the external file '{location}'; a model "
            f"given as bytes or as a ModelProto reads external data only from a directory "
            f"named with base_dir= (or load it from its file path)")
    with _ConfinedDirectory(Path(base_dir), model) as directory:
        budget = resolve_memory_limit(memory_limit)
        for tensor, where in tensors:
            data = directory.read_tensor(tensor, where, budget)
            budget -= len(data)
            tensor.raw_data = data
            del tensor.external_data[:]
            tensor.data_location = TensorProto.DEFAULT


def refuse_unloaded_external(tensor: Any, where: str) -> None:
    """A last line of defence: a tensor whose data is still external here was missed by
    :func:`load_external_data`; reading it through ``onnx.numpy_helper`` would open its
    location relative to the working directory."""
    from onnx import TensorProto

    if tensor.data_location == TensorProto.EXTERNAL:
        raise ModelLoadError(f"{where}: the tensor's data is in an external file that was not "
                             f"loaded from the model's directory; load the model from its "
                             f"file path or give base_dir=")


def _entries(tensor: Any, where: str) -> dict[str, str]:
    """The external data entries of ``tensor`` as text.  protobuf hands a string field that
    is not valid UTF-8 over as bytes: such a key or value (a location, most dangerously) is
    refused, never used as a path."""
    entries: dict[str, str] = {}
    for entry in tensor.external_data:
        key, value = entry.key, entry.value
        if isinstance(key, bytes) or isinstance(value, bytes):
            raise ModelLoadError(f"{where}: an external data entry ({key!r:.80}: "
                                 f"{value!r:.80}) is not valid UTF-8 text")
        if key in entries:
            raise ModelLoadError(f"{where}: external data key '{key}' is given twice")
        entries[key] = value
    return entries


def _expected_bytes(tensor: Any, where: str) -> int:
    """The bytes of the tensor's data: its element count times its element size."""
    from onnx import TensorProto, helper

    if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        raise ModelLoadError(f"{where}: a tensor of type "
                             f"{TensorProto.DataType.Name(tensor.data_type)} cannot keep its "
                             f"data in an external file")
    count = math.prod(int(d) for d in tensor.dims)
    if any(int(d) < 0 for d in tensor.dims):
        raise ModelLoadError(f"{where}: negative dimension {list(tensor.dims)}")
    try:
        numpy_type = helper.tensor_dtype_to_np_dtype(tensor.data_type)
    except (KeyError, ValueError):
        raise ModelLoadError(f"{where}: unknown tensor data type {tensor.data_type}") from None
    bits = {TensorProto.INT4: 4, TensorProto.UINT4: 4}.get(tensor.data_type)
    if bits is None and hasattr(TensorProto, "FLOAT4E2M1") and \
            tensor.data_type == TensorProto.FLOAT4E2M1:
        bits = 4
    if bits is not None:
        return (count * bits + 7) // 8
    return count * numpy_type.itemsize


class _ConfinedDirectory:
    """Files read by relative paths from one opened directory, never leaving it."""

    def __init__(self, root: Path, model: str):
        self.root, self.model = root, model
        try:
            self._fd = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
        except OSError as error:
            raise ModelLoadError(f"{model}: the directory of its external data '{root}' "
                                 f"cannot be opened: {error.strerror}") from None
        self._files: dict[str, int] = {}

    def __enter__(self) -> "_ConfinedDirectory":
        return self

    def __exit__(self, *exc_info: object) -> None:
        for fd in self._files.values():
            os.close(fd)
        os.close(self._fd)

    def read_tensor(self, tensor: Any, where: str, budget: int) -> bytes:
        entries = _entries(tensor, where)
        location = entries.get("location", "")
        expected = _expected_bytes(tensor, where)
        offset = _whole_number(entries.get("offset", "0"), "offset", where)
        if "length" in entries:
            length = _whole_number(entries["length"], "length", where)
            if length != expected:
                raise ModelLoadError(
                    f"{where}: external data length {length:,} differs from the "
                    f"{expected:,} bytes its shape {list(tensor.dims)} needs")
        if expected > budget:
            raise ModelLoadError(
                f"{self.model}: {where} reads {format_size(expected)} of external data, over "
                f"what is left of the memory budget ({format_size(max(budget, 0))})")
        fd = self._open(location, where)
        size = os.fstat(fd).st_size
        if offset + expected > size:
            raise ModelLoadError(
                f"{where}: external file '{location}' holds {size:,} bytes; the tensor needs "
                f"{expected:,} from offset {offset:,}")
        chunks, done = [], 0
        while done < expected:
            try:
                chunk = os.pread(fd, min(_READ_CHUNK, expected - done), offset + done)
            except OSError as error:
                raise ModelLoadError(f"{where}: external file '{location}' cannot be read: "
                                     f"{error.strerror}") from None
            if not chunk:
                raise ModelLoadError(f"{where}: external file '{location}' ended early")
            chunks.append(chunk)
            done += len(chunk)
        return b"".join(chunks)

    def _open(self, location: str, where: str) -> int:
        """The descriptor of the regular file ``location`` inside the directory."""
        if location in self._files:
            return self._files[location]
        parts = _relative_parts(location, where)
        directory, opened = self._fd, []
        try:
            for part in parts[:-1]:
                directory = self._open_entry(part, directory, where, location, folder=True)
                opened.append(directory)
            fd = self._open_entry(parts[-1], directory, where, location, folder=False)
        finally:
            for descriptor in opened:
                os.close(descriptor)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise ModelLoadError(f"{where}: external file '{location}' is not a regular file")
        self._files[location] = fd
        return fd

    def _open_entry(self, name: str, directory: int, where: str, location: str,
                    folder: bool) -> int:
        flags = os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC | (_DIRECTORY if folder else 0)
        try:
            return os.open(name, flags, dir_fd=directory)
        except FileNotFoundError:
            raise ModelLoadError(f"{where}: external file '{location}' does not exist in "
                                 f"'{self.root}'") from None
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.EMLINK) or (
                    error.errno == errno.ENOTDIR and folder and stat.S_ISLNK(
                        os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)):
                raise ModelLoadError(f"{where}: external file '{location}' goes through a "
                                     f"symbolic link; external data must be inside the "
                                     f"model's directory") from None
            raise ModelLoadError(f"{where}: external file '{location}' cannot be opened: "
                                 f"{error.strerror}") from None


def _relative_parts(location: str, where: str) -> list[str]:
    """The components of a location that stays inside its directory, or a ModelLoadError."""
    if not location or "\x00" in location or "\\" in location:
        raise ModelLoadError(f"{where}: external data location {location!r} is not a "
                             f"relative file name")
    path = PurePosixPath(location)
    parts = [p for p in path.parts if p not in ("", ".")]
    if path.is_absolute() or not parts or ".." in parts:
        raise ModelLoadError(f"{where}: external data location {location!r} leaves the "
                             f"model's directory; it must be a path inside it")
    return parts


def _whole_number(text: str, key: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ModelLoadError(f"{where}: external data {key} {text!r} is not a number") from None
    if value < 0:
        raise ModelLoadError(f"{where}: external data {key} {value} is negative")
    return value


def _all_tensors(proto: Any) -> Iterator[tuple[Any, str]]:
    """Every TensorProto of a model, with a description of where it is."""
    yield from _graph_tensors(proto.graph, "graph")
    for function in proto.functions:
        yield from _node_tensors(function.node, f"function '{function.name}'")


def _graph_tensors(graph: Any, where: str) -> Iterator[tuple[Any, str]]:
    # iterative, so that deeply nested subgraphs cannot exhaust the Python stack
    pending = [(graph, where)]
    while pending:
        graph, where = pending.pop()
        for tensor in graph.initializer:
            yield tensor, f"{where}: initializer '{tensor.name}'"
        for sparse in graph.sparse_initializer:
            name = sparse.values.name
            yield sparse.values, f"{where}: values of sparse initializer '{name}'"
            yield sparse.indices, f"{where}: indices of sparse initializer '{name}'"
        for item in _node_tensors(graph.node, where, pending):
            yield item


def _node_tensors(nodes: Any, where: str,
                  pending: list | None = None) -> Iterator[tuple[Any, str]]:
    subgraphs = pending if pending is not None else []
    for node in nodes:
        label = f"{where}: node '{node.name or node.op_type}'"
        for attribute in node.attribute:
            at = f"{label} attribute '{attribute.name}'"
            if attribute.HasField("t"):
                yield attribute.t, at
            for tensor in attribute.tensors:
                yield tensor, at
            if attribute.HasField("sparse_tensor"):
                yield attribute.sparse_tensor.values, at
                yield attribute.sparse_tensor.indices, at
            for sparse in attribute.sparse_tensors:
                yield sparse.values, at
                yield sparse.indices, at
            if attribute.HasField("g"):
                subgraphs.append((attribute.g, at))
            for graph in attribute.graphs:
                subgraphs.append((graph, at))
    if pending is None:
        while subgraphs:
            yield from _graph_tensors(*subgraphs.pop())
