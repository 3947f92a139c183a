"""The browser side of a ``wasm32-browser`` export: a JavaScript loader and a demo page.

The module is the ``wasm32-wasi`` one (``ember.package.export``); a browser has no WASI, so
the loader gives it the few system calls the C library may make -- writes to stdout/stderr
go to the console, the clock and random bytes come from the page, anything else (files,
the environment) answers ``ENOSYS`` -- and then does what a C program does through the API:
copy the weights in, open the model, copy inputs in, run, copy outputs out.  No framework,
no bundler: ``<name>.js`` is one ES module::

    import { load } from "./tinynet.js";
    const model = await load();                     // fetches tinynet.wasm and .weights
    const [logits] = model.run([new Float32Array(model.inputs[0].size)]);
    model.setDims([24]);                            // an export with run-time dims

``index.html`` loads the model, runs it on a fixed input (the pattern of
``examples/c/run_model.c``), and shows the outputs, the time per call and how many threads
it ran on (an export with run-time dims runs at its traced sample; ``model.setDims`` changes
them); opened as ``index.html?report=1`` it also posts that result as JSON to ``result``
beside it (a test or benchmark harness serving the page reads it there).  The module runs
on one thread: threads in the browser need a cross-origin
isolated page (COOP/COEP headers) and a threaded build, which this export is not; the page
says which of the two is missing.

The signature is written into the loader as JSON (``json.dumps``, ASCII only), never as code;
the page puts model names on screen with ``textContent``, never as HTML.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

from ember.package.c_api import API_VERSION, ApiSpec

# numpy dtype name -> JavaScript typed array
_TYPED_ARRAYS = {
    "float32": "Float32Array", "float64": "Float64Array", "int8": "Int8Array",
    "uint8": "Uint8Array", "int16": "Int16Array", "uint16": "Uint16Array",
    "int32": "Int32Array", "uint32": "Uint32Array", "int64": "BigInt64Array",
    "uint64": "BigUint64Array", "bool": "Uint8Array", "float16": "Uint16Array",
    "bfloat16": "Uint16Array",
}


def loader_source(spec: ApiSpec) -> str:
    """``<prefix>.js``: the ES module loading and running the export in a browser."""
    def tensors(infos) -> list[dict]:
        return [{"name": t.name, "dtype": t.dtype.numpy.name, "shape": list(t.shape),
                 "size": int(t.nbytes // t.dtype.itemsize), "nbytes": int(t.nbytes),
                 "itemsize": t.dtype.itemsize,
                 "array": _TYPED_ARRAYS.get(t.dtype.numpy.name, "Uint8Array")}
                for t in infos]

    dims = [{"name": n, "sample": s} for n, s in zip(spec.dims.names, spec.dims.samples)] \
        if spec.dims else []
    signature = json.dumps({"prefix": spec.prefix, "apiVersion": API_VERSION, "dims": dims,
                            "inputs": tensors(spec.inputs), "outputs": tensors(spec.outputs)},
                           ensure_ascii=True)
    return _LOADER.replace("@SIGNATURE@", signature)


_LOADER = r"""// The model exported by ember, for browsers: an ES module with no dependencies.
const SIGNATURE = @SIGNATURE@;

const ENOSYS = 52, EBADF = 8;

// The WASI calls the module imports, answered for a page: output to the console, time and
// random bytes from the browser, no files and no environment.
function wasiImports(getMemory) {
  const decoder = new TextDecoder();
  const pending = { 1: "", 2: "" };
  const view = () => new DataView(getMemory().buffer);
  const calls = {
    fd_write(fd, iovs, count, written) {
      const memory = new Uint8Array(getMemory().buffer);
      let total = 0;
      for (let i = 0; i < count; i++) {
        const base = view().getUint32(iovs + 8 * i, true);
        const length = view().getUint32(iovs + 8 * i + 4, true);
        if (fd === 1 || fd === 2) {
          pending[fd] += decoder.decode(memory.subarray(base, base + length));
        }
        total += length;
      }
      for (const stream of [1, 2]) {
        const lines = pending[stream].split("\n");
        pending[stream] = lines.pop();
        for (const line of lines) (stream === 2 ? console.warn : console.log)(line);
      }
      view().setUint32(written, total, true);
      return fd === 1 || fd === 2 ? 0 : EBADF;
    },
    clock_time_get(id, precision, out) {
      const milliseconds = id === 0 ? Date.now() : performance.now();
      const nanoseconds = BigInt(Math.round(milliseconds * 1e6));
      view().setBigUint64(out, nanoseconds, true);
      return 0;
    },
    random_get(buffer, length) {
      crypto.getRandomValues(new Uint8Array(getMemory().buffer, buffer, length));
      return 0;
    },
    environ_sizes_get(count, size) {
      view().setUint32(count, 0, true);
      view().setUint32(size, 0, true);
      return 0;
    },
    args_sizes_get(count, size) {
      view().setUint32(count, 0, true);
      view().setUint32(size, 0, true);
      return 0;
    },
    environ_get() { return 0; },
    args_get() { return 0; },
    fd_prestat_get() { return EBADF; },
    proc_exit(code) { throw new Error(`the model exited with status ${code}`); },
  };
  // anything else the C library links (files, sockets, ...) is not available in a page
  return new Proxy(calls, { get: (target, name) => target[name] ?? (() => ENOSYS) });
}

class Model {
  constructor(instance, handle) {
    this.exports = instance.exports;
    this.handle = handle;
    this.threads = 1;
    this.api = (name) => this.exports[`${SIGNATURE.prefix}_${name}`];
    // this handle's tensors: the signature's, with the bound shapes once dims are set
    this.inputs = SIGNATURE.inputs.map((t) => ({ ...t }));
    this.outputs = SIGNATURE.outputs.map((t) => ({ ...t }));
    this.dims = SIGNATURE.dims.map((d) => d.name);
    this.inBuffers = this.inputs.map(() => [0, 0]);  // [address, capacity]
    this.outBuffers = this.outputs.map(() => [0, 0]);
    this.inArray = this.api("alloc")(Math.max(4, 4 * this.inputs.length));
    this.outArray = this.api("alloc")(Math.max(4, 4 * this.outputs.length));
    if (this.dims.length) this.setDims(SIGNATURE.dims.map((d) => d.sample));
    else this.allocate();
  }

  // A model exported with run-time dims: set them (in the order of `dims`) before running
  // at other sizes; the tensors' shapes and sizes follow.  Throws, naming the guard, for
  // sizes the export does not serve.
  setDims(values) {
    if (values.length !== this.dims.length) {
      throw new Error(`give ${this.dims.length} dim(s): ${this.dims.join(", ")}`);
    }
    const slot = this.api("alloc")(8 * Math.max(1, values.length));
    const view = new DataView(this.exports.memory.buffer);
    values.forEach((v, d) => view.setBigInt64(slot + 8 * d, BigInt(v), true));
    const status = this.api("set_dims")(this.handle, slot);
    this.api("free")(slot);
    if (status !== 0) throw new Error(lastError(this.exports, SIGNATURE.prefix, status));
    const bound = (kind, tensors) => tensors.forEach((t, i) => {
      const at = this.api(`bound_${kind}_shape`)(this.handle, i);
      const shape = new DataView(this.exports.memory.buffer);
      t.shape = t.shape.map((_, axis) => Number(shape.getBigInt64(at + 8 * axis, true)));
      t.size = t.shape.reduce((a, b) => a * b, 1);
      t.nbytes = t.size * t.itemsize;
    });
    bound("input", this.inputs);
    bound("output", this.outputs);
    this.allocate();
  }

  // Buffers in the module's memory large enough for the current sizes, and the pointer
  // arrays that run() passes pointing at them.
  allocate() {
    const grow = (tensors, buffers, array) => tensors.forEach((t, i) => {
      if (buffers[i][1] >= Math.max(1, t.nbytes)) return;
      if (buffers[i][0]) this.api("free")(buffers[i][0]);
      buffers[i] = [this.api("alloc")(Math.max(1, t.nbytes)), Math.max(1, t.nbytes)];
      new DataView(this.exports.memory.buffer).setUint32(array + 4 * i, buffers[i][0], true);
    });
    grow(this.inputs, this.inBuffers, this.inArray);
    grow(this.outputs, this.outBuffers, this.outArray);
  }

  // inputs: one typed array per input (or an object by name), of the input's size.
  // Returns one typed array per output, in output order (copies: the model's memory moves).
  run(inputs) {
    const given = Array.isArray(inputs) ? inputs : this.inputs.map((t) => inputs[t.name]);
    this.inputs.forEach((t, i) => {
      const value = given[i];
      if (!value || value.byteLength !== t.nbytes) {
        throw new Error(`input ${i} ('${t.name}') must be ${t.nbytes} bytes ` +
                        `(${t.dtype}[${t.shape}])`);
      }
      new Uint8Array(this.exports.memory.buffer, this.inBuffers[i][0], t.nbytes)
        .set(new Uint8Array(value.buffer, value.byteOffset, value.byteLength));
    });
    const status = this.api("run")(this.handle, this.inArray, this.outArray);
    if (status !== 0) throw new Error(lastError(this.exports, SIGNATURE.prefix, status));
    return this.outputs.map((t, j) => {
      const memory = new Uint8Array(this.exports.memory.buffer);
      const bytes = memory.slice(this.outBuffers[j][0], this.outBuffers[j][0] + t.nbytes);
      return new globalThis[t.array](bytes.buffer);
    });
  }
}

function lastError(exports, prefix, status) {
  const start = exports[`${prefix}_last_error`]();
  const memory = new Uint8Array(exports.memory.buffer);
  let end = start;
  while (memory[end] !== 0 && end < start + 512) end++;
  return `status ${status}: ${new TextDecoder().decode(memory.subarray(start, end))}`;
}

// Fetch the module and its weights (beside this file unless `base` says where), instantiate,
// and open the model.
export async function load(base = new URL(".", import.meta.url)) {
  const url = (file) => new URL(file, base);
  const fetchBytes = async (file) => {
    const response = await fetch(url(file));
    if (!response.ok) throw new Error(`${response.url}: ${response.status}`);
    return response.arrayBuffer();
  };
  const [binary, weights] = await Promise.all([
    fetchBytes(`${SIGNATURE.prefix}.wasm`), fetchBytes(`${SIGNATURE.prefix}.weights`),
  ]);
  let memory = null;
  const { instance } = await WebAssembly.instantiate(binary, {
    wasi_snapshot_preview1: wasiImports(() => memory),
  });
  memory = instance.exports.memory;
  const api = (name) => instance.exports[`${SIGNATURE.prefix}_${name}`];
  const staged = api("alloc")(weights.byteLength);
  new Uint8Array(memory.buffer, staged, weights.byteLength).set(new Uint8Array(weights));
  const slot = api("alloc")(4);
  const status = api("open_memory")(SIGNATURE.apiVersion, staged, weights.byteLength, slot);
  const handle = new DataView(memory.buffer).getUint32(slot, true);
  api("free")(staged);
  api("free")(slot);
  if (status !== 0) throw new Error(lastError(instance.exports, SIGNATURE.prefix, status));
  return new Model(instance, handle);
}

export const signature = SIGNATURE;
"""


def page_source(prefix: str) -> str:
    """``index.html``: a self-contained page that loads the model, runs it and shows the
    outputs, the time per call and the threads (``prefix`` is a sanitized C prefix)."""
    return _PAGE.replace("@PREFIX@", prefix)


_PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>ember model @PREFIX@</title>
<style>
  body { font: 15px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
  table { border-collapse: collapse; margin: 1em 0; }
  td, th { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left;
           font-family: monospace; }
  #status.error { color: #b00; }
</style>
</head>
<body>
<h1>ember model <code>@PREFIX@</code> in WebAssembly</h1>
<p id="status">loading...</p>
<p id="threads"></p>
<table id="outputs">
<thead><tr><th>output</th><th>shape</th><th>first values</th></tr></thead><tbody></tbody>
</table>
<pre id="result" hidden></pre>
<script type="module">
import { load } from "./@PREFIX@.js";

const status = document.getElementById("status");
function show(text, error = false) {
  status.textContent = text;
  status.className = error ? "error" : "";
}

// the input of examples/c/run_model.c: a fixed pattern, so that results can be compared
function pattern(tensor) {
  const array = new globalThis[tensor.array](tensor.size);
  if (tensor.dtype === "float32") {
    for (let k = 0; k < tensor.size; k++) array[k] = ((k * 7919) % 1000 - 500) / 500;
  }
  return array;
}

try {
  const started = performance.now();
  const model = await load();
  const loaded = performance.now() - started;
  const inputs = model.inputs.map(pattern);
  let outputs = model.run(inputs);
  const times = [];
  for (let r = 0; r < 20; r++) {
    const t = performance.now();
    outputs = model.run(inputs);
    times.push(performance.now() - t);
  }
  times.sort((a, b) => a - b);
  const median = times[times.length >> 1];
  show(`loaded in ${loaded.toFixed(1)} ms; ` +
       `${median.toFixed(3)} ms per call (median of 20)`);
  document.getElementById("threads").textContent = crossOriginIsolated
    ? "1 thread: the page is cross-origin isolated, but this export is single-threaded."
    : "1 thread: threads need a cross-origin isolated page (serve it with the headers " +
      "Cross-Origin-Opener-Policy: same-origin and " +
      "Cross-Origin-Embedder-Policy: require-corp) " +
      "and a threaded export.";
  const body = document.querySelector("#outputs tbody");
  const result = { milliseconds: median, threads: 1, outputs: [] };
  model.outputs.forEach((tensor, j) => {
    const values = Array.from(outputs[j], (v) => typeof v === "bigint" ? Number(v) : v);
    result.outputs.push({ name: tensor.name, shape: tensor.shape, values });
    const row = body.insertRow();
    const first = values.slice(0, 8).map((v) => +v.toPrecision(6)).join(" ");
    const more = values.length > 8 ? " ..." : "";
    for (const text of [tensor.name, `[${tensor.shape.join(", ")}]`, first + more]) {
      row.insertCell().textContent = text;
    }
  });
  report(result);
} catch (error) {
  show(`failed: ${error.message}`, true);
  report({ error: error.message });
}

// The result as JSON in the page, and, when the address asks for it (?report=1), posted back
// to the server that served the page (how a test harness reads it).
function report(result) {
  const pre = document.getElementById("result");
  pre.textContent = JSON.stringify(result);
  pre.dataset.done = "1";
  if (new URLSearchParams(location.search).get("report") === "1") {
    fetch("result", { method: "POST", body: pre.textContent }).catch(() => {});
  }
}
</script>
</body>
</html>
"""


def find_browser() -> str | None:
    """A Chromium-family browser on PATH, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def open_headless(directory: str | Path, page: str = "index.html", timeout: float = 120
                  ) -> Any:
    """Serve ``directory`` on localhost, open ``page?report=1`` in headless Chromium, and
    return the JSON the page posts back to ``result`` (a browser export's ``index.html``
    does; so may any page, e.g. a benchmark's).  The browser is stopped afterwards; a page
    that posts nothing within ``timeout`` seconds is a TimeoutError."""
    import http.server

    browser = find_browser()
    if browser is None:
        raise FileNotFoundError("no Chromium found (apt-get install chromium)")
    root = Path(directory)
    results: queue.Queue = queue.Queue()

    class Handler(http.server.SimpleHTTPRequestHandler):
        extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                          ".mjs": "text/javascript", ".js": "text/javascript",
                          ".wasm": "application/wasm"}

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def do_POST(self) -> None:  # noqa: N802 -- the http.server API
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            results.put(json.loads(body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    profile = root.parent / f".{root.name}-chromium-profile"
    process = subprocess.Popen(
        [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={profile}",
         f"http://127.0.0.1:{server.server_address[1]}/{page}?report=1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return results.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(f"{page} posted no result within {timeout} s") from None
    finally:
        process.kill()
        process.wait()
        server.shutdown()
        server.server_close()
        shutil.rmtree(profile, ignore_errors=True)
