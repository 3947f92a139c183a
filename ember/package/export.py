"""Export a build for deployment without Python: a C library and header, or a WebAssembly module.

``ember export`` (and :func:`ember.export`) compiles a model for a target and writes a
directory that a C program -- or a WebAssembly host -- uses with nothing of ember::

    tinynet.h            the C API (ember.package.c_api): create, run, destroy, signature
    libtinynet.so        the model's kernels, its entry point and the API (Linux targets)
    libtinynet.a         the same as a static library (link with -lm -pthread)
    tinynet.wasm         instead of both libraries for wasm32-wasi: one module exporting the API
    tinynet.js           for wasm32-browser, also: the JavaScript loader (ember.package.browser)
    index.html           and a page that runs the model and shows its outputs and speed
    tinynet.weights      the weights blob, checked against the library when it is loaded
    export.json          what was written: target, signature, each file's SHA-256
    README.md            how to build a program against it

Targets are the names of :class:`~ember.core.target.Target` (``native``, ``x86_64``,
``x86_64-avx2``, ``x86_64-avx512``, ``aarch64``, ``wasm32``), optionally with the system
spelled out as most toolchains do (``x86_64-linux``, ``aarch64-linux``, ``wasm32-wasi``);
``host`` is ``native``, and ``wasm32-browser`` is the wasm32 module with its browser loader.
Cross targets are compiled by the ``ziglang`` package
(``pip install ziglang``) unless ``$CC`` names a cross compiler.

An export holds one fixed-shape build: a model with dynamic dims is exported for the shapes
given, and a model with ops that ember runs through numpy fallbacks is refused, naming them
(a C program has no numpy to call).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ember import __version__
from ember.core.target import Target
from ember.core.traced import SizeExpr, is_traced, plain
from ember.driver.pipeline import Build
from ember.package.artifact import (SaveTargetError, _read_json_file, _sha256_of_regular_file,
                                    refuse_foreign_entries, write_directory_in_place)
from ember.package.c_api import (API_VERSION, ApiSpec, DimsSpec, ExportError, TensorInfo,
                                 api_source, c_prefix, header_source, weights_digest,
                                 weights_file_bytes, weights_unit_source)

EXPORT_FILE = "export.json"
EXPORT_FORMAT = "ember-export"
EXPORT_FORMAT_VERSION = 1

_SYSTEMS = {"linux": ("x86_64", "aarch64"), "wasi": ("wasm32",), "browser": ("wasm32",)}


def parse_export_target(name: str | Target) -> Target:
    """The :class:`Target` of an export target name (see the module docstring)."""
    if isinstance(name, Target):
        return name
    text = name.strip()
    if text == "host":
        return Target.native()
    base, _, system = text.rpartition("-")
    if base and system in _SYSTEMS:
        target = Target.parse(base)
        if target.arch not in _SYSTEMS[system] and target.kind != "native":
            raise ExportError(f"export target {name!r}: {target.arch} code does not run on "
                              f"{system}; use one of {', '.join(EXPORT_TARGETS)}")
        return target
    return Target.parse(text)


EXPORT_TARGETS = ("host", "x86_64-linux", "x86_64-avx2-linux", "x86_64-avx512-linux",
                  "aarch64-linux", "wasm32-wasi", "wasm32-browser")


def is_browser_target(name: str | Target) -> bool:
    """Whether the export target ``name`` asks for the browser loader and page."""
    return isinstance(name, str) and name.strip().endswith("-browser")


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_build` wrote: the directory and its files by role."""

    directory: Path
    prefix: str
    target: Target
    files: dict[str, Path]  # role ("header", "shared", "static", "wasm", "weights") -> path
    report: str = ""  # the build's report (kernels, fallbacks, memory plan)


def api_spec(build: Build, prefix: str, blob: np.ndarray, dims: DimsSpec | None = None
             ) -> ApiSpec:
    """The C API's description of ``build`` (refusing what a C program cannot run);
    ``dims``: the run-time dims of a traced build (its shapes are then the sample's)."""
    if build.host_nodes:
        ops = sorted({impl.node.op for impl in build.host_nodes})
        names = ", ".join(f"'{impl.node.name}' ({impl.node.op})" for impl in build.host_nodes[:5])
        raise ExportError(f"the model runs {len(build.host_nodes)} node(s) through numpy "
                          f"fallbacks ({names}), which a program without Python cannot call; "
                          f"ops without compiled kernels: {', '.join(ops)}")
    g = build.graph

    def info(name: str) -> TensorInfo:
        vtype = g.types[name]
        if dims is None and (any(is_traced(d) or not isinstance(d, int) for d in vtype.shape)
                             or is_traced(build.workspace_size)):
            raise ExportError(f"'{name}' has the dynamic shape {list(vtype.shape)}; an export "
                              f"is compiled for fixed shapes: give every input's shape")
        return TensorInfo(name, vtype.dtype, tuple(plain(d) for d in vtype.shape))

    return ApiSpec(prefix, tuple(info(n) for n in g.inputs), tuple(info(n) for n in g.outputs),
                   int(build.weights_size), weights_digest(blob), plain(build.workspace_size),
                   dims)


def weights_blob(build: Build) -> np.ndarray:
    """The bytes ``ember_run`` reads as its weights: each constant at its offset."""
    blob = np.zeros(int(build.weights_size), dtype=np.uint8)
    for name, array in build.weights.items():
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        offset = build.weight_offsets[name]
        blob[offset:offset + raw.size] = raw
    return blob


def export_build(build: Build, directory: str | Path, name: str | None = None,
                 browser: bool = False, dims: DimsSpec | None = None,
                 sanitize: bool = False, embed_weights: bool = False) -> ExportResult:
    """Write ``build`` as a deployable directory (see the module docstring); ``name`` (default:
    the graph's name) becomes the file names and the prefix of the C functions; ``browser``
    (a wasm32 build only) adds the JavaScript loader and the page; ``dims``: the run-time
    dims of a traced build (the C API then takes them, ``<name>_set_dims``); ``sanitize``
    builds the libraries with AddressSanitizer and UBSan (for tests, as ``BuildOptions``);
    ``embed_weights`` links the weights into the libraries (``<name>_create_embedded``)
    instead of writing ``<name>.weights`` (Linux targets)."""
    prefix = c_prefix(name if name is not None else (build.graph.name or "model"))
    blob = weights_blob(build)
    target = build.target
    if embed_weights and target.arch == "wasm32":
        raise ExportError("embedded weights are for Linux targets: a wasm module takes its "
                          "weights from memory (ember.runtime.wasm and the browser loader do)")
    if browser and target.arch != "wasm32":
        raise ExportError(f"a browser export needs a wasm32 build, not {target.triple}")
    spec = dataclasses.replace(api_spec(build, prefix, blob, dims), embedded=embed_weights,
                               march=tuple(target.march))
    with tempfile.TemporaryDirectory(prefix="ember-weights-") as scratch:
        extra = []
        if embed_weights:
            blob_path = Path(scratch) / "weights.bin"
            blob_path.write_bytes(blob.tobytes())
            extra.append(weights_unit_source(prefix, str(blob_path), spec.weights_sha256))
        libraries = _build_libraries(build, [api_source(spec), *extra], prefix, sanitize)
    contents: dict[str, bytes | Path | Callable[[Path], None]] = {
        f"{prefix}.h": header_source(spec).encode("utf-8")}
    roles = {"header": f"{prefix}.h"}
    if not embed_weights:
        contents[f"{prefix}.weights"] = weights_file_bytes(blob)
        roles["weights"] = f"{prefix}.weights"
    for role, (file_name, made) in libraries.items():
        contents[file_name] = made
        roles[role] = file_name
    if browser:
        from ember.package.browser import loader_source, page_source

        contents[f"{prefix}.js"] = loader_source(spec).encode("utf-8")
        contents["index.html"] = page_source(prefix).encode("utf-8")
        roles["loader"], roles["page"] = f"{prefix}.js", "index.html"
    contents["README.md"] = _readme(spec, target, roles).encode("utf-8")

    def write(staging: Path) -> None:
        os.chmod(staging, 0o777 & ~_umask())  # a directory as mkdir makes it, not mkdtemp's
        digests = {}
        for file_name, data in contents.items():
            destination = staging / file_name
            if isinstance(data, Path):
                shutil.copyfile(data, destination)
            elif callable(data):
                data(destination)
            else:
                destination.write_bytes(data)
            digests[file_name] = _sha256_of_regular_file(destination)
        record = {
            "format": EXPORT_FORMAT, "format_version": EXPORT_FORMAT_VERSION,
            "ember_version": __version__, "api_version": API_VERSION, "prefix": prefix,
            "target": {**target.to_dict(), "arch": target.arch},
            "inputs": [_describe(t, dims.inputs[i] if dims else None)
                       for i, t in enumerate(spec.inputs)],
            "outputs": [_describe(t, dims.outputs[i] if dims else None)
                        for i, t in enumerate(spec.outputs)],
            "dims": [{"name": n, "sample": s, "covered": list(c) if c else None}
                     for n, s, c in zip(dims.names, dims.samples, dims.covered)] if dims else [],
            "files": digests,
        }
        (staging / EXPORT_FILE).write_text(json.dumps(record, indent=1) + "\n",
                                           encoding="utf-8")

    path = write_directory_in_place(Path(directory), write, _check_replaceable,
                                    _remove_export_files, "export")
    return ExportResult(path, prefix, target, {role: path / file_name
                                               for role, file_name in roles.items()},
                        build.report())


def _describe(tensor: TensorInfo, axes: tuple[SizeExpr, ...] | None = None) -> dict:
    """A tensor in ``export.json``: its shape (the traced sample's for a traced export), and
    for a traced export each axis as a number or, where it is a run-time dim, its index
    (``{"dim": i}``; other size expressions as ``{"expr": text}``)."""
    described = {"name": tensor.name, "dtype": tensor.dtype.numpy.name,
                 "shape": list(tensor.shape)}
    if axes is not None:
        described["axes"] = [sample if axis.op == "const" else
                             {"dim": axis.args[0]} if axis.op == "sym" else {"expr": str(axis)}
                             for axis, sample in zip(axes, tensor.shape)]
    return described


def _build_libraries(build: Build, units: list[str], prefix: str, sanitize: bool = False
                     ) -> dict[str, tuple[str, Path | Callable[[Path], None]]]:
    """Compile the API's ``units`` with the build's kernels: role -> (file name, the built
    file or a function writing it to a path)."""
    from ember.toolchain.archive import archive
    from ember.toolchain.compiler import build_library, find_compiler
    from ember.toolchain.units import UnitBuild, UnitSource

    target = build.target
    if target.arch == "wasm32" or build.units is None:
        # one translation unit: the build's own source with the API after it
        library = build_library("\n".join([build.source, *units]), target, sanitize=sanitize)
        if target.arch == "wasm32":
            return {"wasm": (f"{prefix}.wasm", library.path)}
        return {"shared": (f"lib{prefix}.so", library.path)}
    sources = [UnitSource(text, flags) for text, flags in build.units.flagged_sources()]
    sources += [UnitSource(unit) for unit in units]
    with UnitBuild(target, sanitize=sanitize) as units:
        shared = units.link(sources)
        objects = [obj.path for obj in units.objects(sources)]
    compiler = find_compiler(target)
    return {"shared": (f"lib{prefix}.so", shared.path),
            "static": (f"lib{prefix}.a", lambda out: archive(compiler, objects, out))}


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _check_replaceable(path: Path) -> None:
    """Refuse an existing ``path`` unless it is an empty directory or an earlier export whose
    every file ``export.json`` vouches for (by SHA-256)."""
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        raise SaveTargetError(f"'{path}' exists and is not an export directory; not "
                              f"overwriting it (choose another path)", path)
    entries = sorted(os.listdir(path))
    if not entries:
        return
    owned = _export_files(path)
    refuse_foreign_entries(path, [entry for entry in entries if entry not in owned], "export")


def _export_files(directory: Path) -> set[str]:
    """The names in ``directory`` that its ``export.json`` lists with their current digest
    (and the record itself); none without a valid record."""
    record = _read_json_file(directory / EXPORT_FILE)
    if not isinstance(record, dict) or record.get("format") != EXPORT_FORMAT or \
            not isinstance(record.get("files"), dict):
        return set()
    owned = {EXPORT_FILE}
    for file_name, digest in record["files"].items():
        if isinstance(file_name, str) and "/" not in file_name and file_name not in (".", "..") \
                and _sha256_of_regular_file(directory / file_name) == digest:
            owned.add(file_name)
    return owned


def _remove_export_files(directory: Path) -> None:
    """Delete an old export's own files from ``directory``, then the directory if empty."""
    for file_name in _export_files(directory):
        with contextlib.suppress(OSError):
            (directory / file_name).unlink()
    with contextlib.suppress(OSError):  # not empty: something else is in it
        os.rmdir(directory)


def _readme(spec: ApiSpec, target: Target, roles: dict[str, str]) -> str:
    p = spec.prefix
    if spec.dims is not None:
        covered = ", ".join(
            f"{n} {c[0]}..{c[1]}" if c else f"{n} (see the guards)"
            for n, c in zip(spec.dims.names, spec.dims.covered))
        dims_note = (f"\n\nRun-time dims: {', '.join(spec.dims.names)}; call `{p}_set_dims` "
                     f"before running (traced at {dict(zip(spec.dims.names, spec.dims.samples))}"
                     f"; it serves {covered}, each with the others at their sample). The "
                     f"shapes below are the traced sample's; `-1` marks a dynamic axis in "
                     f"`{p}_input_shape`.")
    else:
        dims_note = ""
    signature = "\n".join(
        f"- {kind} {i}: `{t.name}` {t.dtype.numpy.name}{list(t.shape)} ({t.nbytes:,} bytes)"
        for kind, tensors in (("input", spec.inputs), ("output", spec.outputs))
        for i, t in enumerate(tensors))
    if "weights" not in roles:
        dims_note += (f"\n\nThe weights are linked into the library: open the model with "
                      f"`{p}_create_embedded(&model)`; the example program takes `-e`.")
    if "page" in roles:
        build = (f"Serve this directory over HTTP (for example `python -m http.server`) and open "
                 f"`index.html`: it loads the model with `{p}.js`, runs it and shows the outputs "
                 f"and the time per call. In your own page: `import {{ load }} from "
                 f"\"./{p}.js\"; const model = await load(); const outputs = "
                 f"model.run(inputs);` (one typed array per input and output).")
    elif "wasm" in roles:
        build = (f"`{roles['wasm']}` is a WebAssembly (WASI) module exporting the functions of "
                 f"`{p}.h`. A host instantiates it with WASI, copies the weights file into "
                 f"memory from `{p}_alloc`, calls `{p}_open_memory({API_VERSION}, ...)`, then "
                 f"`{p}_run` with input and output buffers allocated the same way.")
    else:
        build = (f"Build a program against it (`examples/c/run_model.c` of ember's repository "
                 f"runs any export):\n\n"
                 f"    cc -O2 -I. -DMODEL={p} run_model.c -L. -l{p} -Wl,-rpath,'$ORIGIN' "
                 f"-o run_model\n"
                 f"    cc -O2 -I. -DMODEL={p} run_model.c lib{p}.a -lm -pthread "
                 f"-o run_model_static\n"
                 f"    ./run_model " + (f"{p}.weights" if "weights" in roles else "-e"))
        if target.arch == "aarch64":
            build += (f"\n\nFrom another machine, the `ziglang` package cross-compiles the "
                      f"program too (statically linked, it needs nothing on the board):\n\n"
                      f"    python -m ziglang cc -target aarch64-linux-musl -static -O2 -I. "
                      f"-DMODEL={p} run_model.c lib{p}.a -lm -o run_model")
    return (f"# {p}: exported by ember {__version__}\n\n"
            f"Target: {target.triple} ({target.vector_bits}-bit vectors). "
            f"Signature:\n\n{signature}{dims_note}\n\n{build}\n\n"
            f"The C API, with the ownership and error rules, is documented in `{p}.h`.\n")
