"""A saved artifact's library runs from a plain C program as it does from ``ember.runtime``.

The program (no Python in it) opens ``model.so`` with ``dlopen``, sets the thread count with
``ember_set_num_threads``, calls ``ember_run`` on the weights blob and an input, and writes
the output; it must match the numpy-only runtime's output exactly, and the library's own
pool must have run the parallel loops on two threads (its counters, read from C).
"""

from __future__ import annotations

import subprocess
import textwrap

import numpy as np
import pytest

import ember
import ember.runtime
from ember.core.target import Target
from ember.toolchain import find_compiler

from test_threads import M, K, N, _expected, _model

PROGRAM = textwrap.dedent("""
    #include <dlfcn.h>
    #include <stdint.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>

    typedef int32_t (*run_fn)(void *const *, void *const *, const uint8_t *, uint8_t *,
                              void *, void *);

    static void *read_file(const char *path, size_t *size) {
      FILE *f = fopen(path, "rb");
      if (f == NULL) return NULL;
      fseek(f, 0, SEEK_END);
      *size = (size_t)ftell(f);
      fseek(f, 0, SEEK_SET);
      void *data = aligned_alloc(64, (*size + 63) / 64 * 64 + 64);
      if (fread(data, 1, *size, f) != *size) { fclose(f); return NULL; }
      fclose(f);
      return data;
    }

    int main(int argc, char **argv) {
      if (argc != 6) return 2;
      void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
      if (lib == NULL) { fprintf(stderr, "%s\\n", dlerror()); return 3; }
      run_fn run = (run_fn)dlsym(lib, "ember_run");
      int64_t (*workspace_size)(void) = (int64_t (*)(void))dlsym(lib, "ember_workspace_size");
      void (*set_threads)(int) = (void (*)(int))dlsym(lib, "ember_set_num_threads");
      int (*get_threads)(void) = (int (*)(void))dlsym(lib, "ember_get_num_threads");
      int (*stats)(int64_t *, int) = (int (*)(int64_t *, int))dlsym(lib, "ember_thread_stats");
      if (!run || !workspace_size || !set_threads || !get_threads || !stats) return 4;
      size_t weights_size, input_size;
      uint8_t *weights = read_file(argv[2], &weights_size);
      float *input = read_file(argv[3], &input_size);
      if (weights == NULL || input == NULL) return 5;
      const size_t output_size = (size_t)atol(argv[5]);
      float *output = aligned_alloc(64, (output_size + 63) / 64 * 64);
      const int64_t ws = workspace_size();
      uint8_t *workspace = aligned_alloc(64, (size_t)((ws + 63) / 64 * 64 + 64));
      set_threads(2);
      if (get_threads() != 2) return 6;
      void *inputs[1] = {input}, *outputs[1] = {output};
      /* 30 calls at least; on a busy machine the workers may not be scheduled in time to
         claim a chunk of those (the caller then runs them all, which is correct), so keep
         calling until one did, up to 3,000 calls */
      int64_t counts[6];
      for (int rep = 0; rep < 3000; ++rep) {
        if (run(inputs, outputs, weights, workspace, NULL, NULL) != 0) return 7;
        stats(counts, 6);
        if (rep >= 29 && counts[2] > 0) break;
      }
      FILE *out = fopen(argv[4], "wb");
      fwrite(output, 1, output_size, out);
      fclose(out);
      stats(counts, 6);
      printf("parallel %lld worker_chunks %lld\\n", (long long)counts[0], (long long)counts[2]);
      return 0;
    }
""")


def test_the_c_entry_point_runs_an_artifact_on_the_pool(tmp_path):
    compiler = find_compiler(Target.native())
    if compiler.family == "zig":
        pytest.skip("this test links a host program with the system C compiler")
    model, w = _model()
    artifact = ember.compile(model).save(tmp_path / "mm.ember")
    loaded = ember.runtime.load(artifact, threads=2)
    x = np.random.default_rng(11).standard_normal((M, K)).astype(np.float32)
    expected = loaded(x)
    np.testing.assert_allclose(expected, _expected(x, w), rtol=1e-4, atol=1e-3)
    (tmp_path / "weights.bin").write_bytes(loaded._weights.tobytes())
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    source, program = tmp_path / "run.c", tmp_path / "run"
    source.write_text(PROGRAM)
    build = subprocess.run([*compiler.argv, "-std=c11", "-O1", "-o", str(program), str(source),
                            "-ldl"], capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr[-3000:]
    result = subprocess.run([str(program), str(artifact / "model.so"),
                             str(tmp_path / "weights.bin"), str(tmp_path / "x.bin"),
                             str(tmp_path / "y.bin"), str(M * N * 4)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr[-2000:])
    ours = np.frombuffer((tmp_path / "y.bin").read_bytes(), np.float32).reshape(M, N)
    np.testing.assert_array_equal(ours, expected)
    counts = dict(zip(result.stdout.split()[::2], map(int, result.stdout.split()[1::2])))
    assert counts["parallel"] >= 30 and counts["worker_chunks"] > 0, result.stdout
