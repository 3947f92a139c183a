"""ember's thread pool (ember/codegen/c_threads.py) under ThreadSanitizer and ASan + UBSan.

The pool hands out chunks through one atomic word and lets threads block on condition
variables; a mistake there is a data race or a lost wake-up that no single run shows.  So a
C driver, compiled with the generated module into one sanitized program, calls a kernel with
nested parallel loops thousands of times at 1..4 threads, from several threads of its own at
once, after changing the thread count mid-way and in a forked child, and checks every
output against the formula.  ThreadSanitizer must report nothing (it exits non-zero on any
report), and the AddressSanitizer/UBSan build must run clean.
"""

from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from ember.codegen import CModule, generate_c
from ember.core.dtypes import DType
from ember.core.target import Target
from ember.ir.loop import Buffer, For, ForKind, Load, PrimFunc, Store, Var, const
from ember.ir.loop.expr import Const
from ember.toolchain import find_compiler

ROWS, COLS = 24, 40

DRIVER = textwrap.dedent("""
    /* ---- the test driver ---- */
    #include <stdio.h>
    #include <sys/wait.h>
    #include <unistd.h>

    #define ROWS %(rows)d
    #define COLS %(cols)d
    #define CALLERS 3

    static float inputs[ROWS * COLS];

    static int run_and_check(float *out) {
      for (int i = 0; i < ROWS * COLS; ++i) out[i] = -1.0f;
      nested(inputs, out);
      for (int i = 0; i < ROWS * COLS; ++i)
        if (out[i] != inputs[i] * 2.0f + 1.0f) {
          fprintf(stderr, "element %%d is %%g\\n", i, out[i]);
          return 0;
        }
      return 1;
    }

    static void *caller(void *arg) {
      float *out = arg;
      for (int rep = 0; rep < 300; ++rep)
        if (!run_and_check(out)) return (void *)1;
      return NULL;
    }

    int main(void) {
      static float outs[CALLERS][ROWS * COLS];
      for (int i = 0; i < ROWS * COLS; ++i) inputs[i] = (float)(i %% 97) - 40.0f;
      for (int threads = 1; threads <= 4; ++threads) {
        ember_set_num_threads(threads);
        if (ember_get_num_threads() != threads) { fprintf(stderr, "thread count\\n"); return 2; }
        for (int rep = 0; rep < 400; ++rep)
          if (!run_and_check(outs[0])) return 3;
      }
      /* several callers at once: one owns the pool, the others run serially */
      ember_set_num_threads(3);
      pthread_t others[CALLERS - 1];
      for (int t = 0; t < CALLERS - 1; ++t) pthread_create(&others[t], NULL, caller, outs[t + 1]);
      void *failed = caller(outs[0]);
      for (int t = 0; t < CALLERS - 1; ++t) {
        void *result;
        pthread_join(others[t], &result);
        if (result != NULL) failed = result;
      }
      if (failed != NULL) return 4;
      /* a forked child starts with no workers and a free pool */
      const pid_t child = fork();
      if (child == 0) _exit(run_and_check(outs[0]) && run_and_check(outs[0]) ? 0 : 1);
      int status = 0;
      if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
          WEXITSTATUS(status) != 0) return 5;
      int64_t stats[6];
      ember_thread_stats(stats, 6);
      printf("parallel %%lld serial %%lld worker_chunks %%lld started %%lld\\n",
             (long long)stats[0], (long long)stats[1], (long long)stats[2],
             (long long)stats[5]);
      return 0;
    }
""") % {"rows": ROWS, "cols": COLS}


def _nested_kernel() -> PrimFunc:
    """``out[r, c] = x[r, c] * 2 + 1`` with a parallel loop over rows and, inside it, one
    over columns (the inner one runs serially in whichever thread runs its row)."""
    x = Buffer("x", DType.FLOAT32, (ROWS * COLS,))
    out = Buffer("out", DType.FLOAT32, (ROWS * COLS,))
    r, c = Var("r"), Var("c")
    index = r * const(COLS) + c
    value = Load(x, index) * Const(2.0, DType.FLOAT32) + Const(1.0, DType.FLOAT32)
    inner = For(c, const(0), const(COLS), ForKind.PARALLEL, Store(out, index, value))
    return PrimFunc("nested", (x, out), For(r, const(0), const(ROWS), ForKind.PARALLEL, inner))


def _build_and_run(tmp_path, sanitizer: str, env: dict[str, str]) -> str:
    target = Target.native()
    compiler = find_compiler(target)
    if compiler.family not in ("gcc", "clang"):
        pytest.skip(f"sanitizers need gcc or clang, not {compiler.family}")
    source = generate_c(CModule([_nested_kernel()], target, exports=["nested"])) + DRIVER
    assert "em_parallel_for(em_par" in source
    src = tmp_path / "pool.c"
    src.write_text(source)
    exe = tmp_path / "pool"
    build = subprocess.run([*compiler.argv, "-std=c11", "-O1", "-g", *target.march, "-pthread",
                            f"-fsanitize={sanitizer}", "-fno-omit-frame-pointer",
                            "-o", str(exe), str(src), "-lm"],
                           capture_output=True, text=True, timeout=300)
    if build.returncode != 0 and "sanitize" in build.stderr and "cannot find" in build.stderr:
        pytest.skip(f"no {sanitizer} runtime: {build.stderr[-300:]}")
    assert build.returncode == 0, build.stderr[-4000:]
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300,
                            env={**os.environ, **env})
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr[-6000:])
    assert "WARNING" not in result.stderr, result.stderr[-6000:]
    return result.stdout


def test_pool_has_no_data_race_under_thread_sanitizer(tmp_path):
    # the child of a multi-threaded fork starts workers again: allowed for this test
    out = _build_and_run(tmp_path, "thread", {"TSAN_OPTIONS": "die_after_fork=0"})
    counts = dict(zip(out.split()[::2], map(int, out.split()[1::2])))
    assert counts["parallel"] > 0 and counts["started"] >= 1, out
    assert counts["serial"] > 0, out  # one thread, nested loops, the concurrent callers


def test_pool_runs_clean_under_address_and_undefined_sanitizers(tmp_path):
    _build_and_run(tmp_path, "address,undefined",
                   {"ASAN_OPTIONS": "detect_leaks=0", "UBSAN_OPTIONS": "halt_on_error=1"})
