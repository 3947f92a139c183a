"""ember's own thread pool, compiled into every generated library.

Why not OpenMP: a compiled model used to run its PARALLEL loops through ``#pragma omp``, so
libgomp decided how threads waited, and it decided from the user's environment.  Its default
(spin briefly, then sleep) ends every parallel region at a barrier that waits for *all* of
its threads; when another process holds one of the cores, the thread scheduled behind it
makes the barrier wait out a scheduler time slice (milliseconds) for each region.  The
bundled model took 132-144 ms a call on a loaded 2-core machine against ONNX Runtime's
0.48 ms, and 0.8 ms with ``OMP_WAIT_POLICY=PASSIVE`` -- a setting no user knows to make, and
one that libgomp reads only when it loads.  So ember owns its threads (``docs/threads.md``
has the measurements):

* **Dynamic chunks, no barrier.**  ``em_parallel_for`` splits a loop into chunks that the
  caller and the workers claim one at a time from one atomic word.  The caller works too; a
  worker that starts late (preempted, or still waking) simply claims nothing, and the caller
  waits only for chunks that were claimed and are still running -- never for a thread that
  has not shown up.  Workers end a loop without any barrier among themselves.
* **Spin, yield, then block.**  A worker that finds no work spins for a bounded time (so
  the next kernel of the same call finds it awake): 20 us of ``pause``, then up to 200 us
  calling ``sched_yield`` between checks, so that a spinning worker never holds a core that
  the caller (or anyone else) could use -- on a busy machine it often shares one with the
  caller, and a plain spin there made two threads slower than one -- then it sleeps on a
  condition variable.  The caller waiting for a straggler's chunk spins the same way, then
  sleeps too, which frees its core for a straggler that was preempted.  After a longer idle
  time (10 s) a worker exits; the next loop starts it again.  The durations are macros
  (``EM_WORKER_SPIN_NS``, ``EM_PAUSE_SPIN_NS``, ``EM_CALLER_SPIN_NS``) a build may set.
* **Never more runnable threads than asked.**  ``threads`` counts the caller: ``n`` threads
  are the caller and ``n - 1`` workers.  The default is the CPUs this process may run on
  (``sched_getaffinity``) capped by the cgroup CPU quota, read when the first loop runs; a
  caller may change it at any time with ``ember_set_num_threads`` (the Python runtime's
  ``threads=``), which takes effect at the next loop.  A loop started inside another's
  chunk, or while another thread of the process is using the pool, runs serially in its
  caller: nested and concurrent calls never multiply the threads.
* **Fork and unload safe.**  A forked child starts with no workers and a free pool
  (``pthread_atfork``); unloading the library stops and joins its workers first.

WebAssembly (and any build defining ``EMBER_NO_THREADS``) gets the same functions running
every loop serially.

The claim word packs a generation (24 bits: workers tell a new loop from the last), the
loop's chunk count (20 bits) and the next unclaimed chunk (20 bits), so one
compare-and-swap both validates and takes a chunk: a worker holding a stale word can only
fail, or take a chunk that is genuinely free in the current loop, whose fields it then reads.
"""

from __future__ import annotations

# Exported by every library: the thread controls and the pool's counters.
THREAD_FUNCTIONS = ("ember_set_num_threads", "ember_get_num_threads", "ember_thread_stats")

# The counters of ember_thread_stats, in order.
THREAD_STATS = ("parallel_loops", "serial_loops", "worker_chunks", "caller_blocks",
                "worker_sleeps", "threads_started")

# Units that run loops declare these; the entry unit defines them.
POOL_DECLARATIONS = """\
/* ---- threads: parallel loops run on ember's pool (the entry unit defines it) ---- */
typedef void (*em_task_fn)(void *context, int64_t begin, int64_t end);
EMBER_INTERNAL void em_parallel_for(em_task_fn fn, void *context, int64_t extent,
                                    int64_t chunk);"""

# Headers the pool needs beyond the prelude's; _GNU_SOURCE (for sched_getaffinity) must come
# before the first include of the unit.
POOL_FEATURES = "#define _GNU_SOURCE 1"
POOL_INCLUDES = """\
#if !defined(__wasm__) && !defined(EMBER_NO_THREADS)
#define EM_POOL_THREADS 1
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#else
#define EM_POOL_THREADS 0
#endif"""

POOL_SOURCE = POOL_DECLARATIONS + r"""

#define EM_STAT_COUNT 6
static atomic_llong em_stats[EM_STAT_COUNT];
static atomic_int em_requested_threads = 0;

/* Counters of the pool since the library loaded, for tests and tuning: loops run in
   parallel, loops run serially, chunks run by workers, times the caller blocked waiting for
   a straggler's chunk, times a worker went to sleep, threads started.  Fills up to n
   entries of out; returns how many counters there are. */
EMBER_EXPORT int ember_thread_stats(int64_t *out, int n) {
  for (int i = 0; i < n && i < EM_STAT_COUNT; ++i)
    out[i] = atomic_load_explicit(&em_stats[i], memory_order_relaxed);
  return EM_STAT_COUNT;
}

static inline void em_count(int which) {
  atomic_fetch_add_explicit(&em_stats[which], 1, memory_order_relaxed);
}

/* n > 0: use n threads (the caller and n - 1 workers) from the next loop on; n <= 0: the
   default, the CPUs this process may use. */
EMBER_EXPORT void ember_set_num_threads(int n) {
  atomic_store_explicit(&em_requested_threads, n > 0 ? n : 0, memory_order_relaxed);
}

#if EM_POOL_THREADS

#define EM_MAX_THREADS 256
#define EM_CHUNK_BITS 20
#define EM_MAX_CHUNKS ((1 << EM_CHUNK_BITS) - 1)
#define EM_CHUNKS_PER_THREAD 4
/* How long a worker that ran out of work stays awake for the next loop, how long the caller
   spins for a straggler's chunk before it sleeps, and how long an idle worker lives. */
#ifndef EM_WORKER_SPIN_NS
#define EM_WORKER_SPIN_NS 200000LL
#endif
#ifndef EM_PAUSE_SPIN_NS
#define EM_PAUSE_SPIN_NS 20000LL
#endif
#ifndef EM_CALLER_SPIN_NS
#define EM_CALLER_SPIN_NS 200000LL
#endif
#define EM_IDLE_EXIT_S 10

enum { EM_SLOT_EMPTY, EM_SLOT_RUNNING, EM_SLOT_EXITED };

static struct {
  pthread_mutex_t lock;
  pthread_cond_t wake;      /* workers sleep here until a new loop */
  pthread_cond_t finished;  /* the caller sleeps here until the last chunk is done */
  _Atomic uint64_t ticket;  /* generation:24 | chunks:20 | next chunk:20 */
  _Atomic(em_task_fn) fn;
  _Atomic(void *) context;
  atomic_llong extent, chunk;
  atomic_int participants;  /* threads of this loop, the caller included */
  atomic_llong done;        /* chunks finished */
  atomic_int sleepers;
  atomic_int caller_sleeping;
  atomic_int busy;          /* a caller owns the pool */
  atomic_int live;          /* workers started and not exited */
  int stopping;
  int slot_state[EM_MAX_THREADS];
  uint32_t slot_seen[EM_MAX_THREADS];  /* the generation before a worker's first loop */
  pthread_t slots[EM_MAX_THREADS];
} em_pool = {
  .lock = PTHREAD_MUTEX_INITIALIZER,
  .wake = PTHREAD_COND_INITIALIZER,
  .finished = PTHREAD_COND_INITIALIZER,
};

static _Thread_local int em_in_pool;  /* a worker, or a caller running its chunks */
static atomic_int em_default_threads_cached = 0;
static pthread_once_t em_fork_once = PTHREAD_ONCE_INIT;

static inline uint32_t em_ticket_generation(uint64_t t) { return (uint32_t)(t >> 40); }
static inline int64_t em_ticket_chunks(uint64_t t) {
  return (int64_t)((t >> EM_CHUNK_BITS) & EM_MAX_CHUNKS);
}
static inline int64_t em_ticket_next(uint64_t t) { return (int64_t)(t & EM_MAX_CHUNKS); }

static inline void em_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield");
#endif
}

static int64_t em_now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* ---- how many CPUs this process was given ---- */

/* The CPU quota of a cgroup v2 directory (cpu.max "quota period"), rounded up; 0: none. */
static int em_cgroup2_limit(const char *dir) {
  char path[4352];
  snprintf(path, sizeof path, "/sys/fs/cgroup%s/cpu.max", dir);
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  char quota[32] = {0};
  long long period = 0;
  const int read = fscanf(f, "%31s %lld", quota, &period);
  fclose(f);
  if (read != 2 || period <= 0 || quota[0] < '0' || quota[0] > '9') return 0;  /* "max" */
  const long long q = atoll(quota);
  return q > 0 ? (int)((q + period - 1) / period) : 0;
}

/* The tightest CPU quota on the way from this process's cgroup up to the root (v2), or of
   the v1 cpu controller; 0 when there is none. */
static int em_cgroup_limit(void) {
  int best = 0;
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (f != NULL) {
    char line[4096];
    while (fgets(line, sizeof line, f) != NULL) {
      if (strncmp(line, "0::", 3) != 0) continue;
      char *dir = line + 3;
      dir[strcspn(dir, "\n")] = '\0';
      for (;;) {
        const int limit = em_cgroup2_limit(strcmp(dir, "/") == 0 ? "" : dir);
        if (limit > 0 && (best == 0 || limit < best)) best = limit;
        char *slash = strrchr(dir, '/');
        if (slash == NULL || slash == dir) break;
        *slash = '\0';
      }
      const int root = em_cgroup2_limit("");
      if (root > 0 && (best == 0 || root < best)) best = root;
    }
    fclose(f);
  }
  FILE *q = fopen("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "r");
  FILE *p = fopen("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "r");
  long long quota = -1, period = 0;
  if (q != NULL && p != NULL && fscanf(q, "%lld", &quota) == 1 &&
      fscanf(p, "%lld", &period) == 1 && quota > 0 && period > 0) {
    const int limit = (int)((quota + period - 1) / period);
    if (best == 0 || limit < best) best = limit;
  }
  if (q != NULL) fclose(q);
  if (p != NULL) fclose(p);
  return best;
}

static int em_default_threads(void) {
  int n = atomic_load_explicit(&em_default_threads_cached, memory_order_relaxed);
  if (n > 0) return n;
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
  if (n <= 0) {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    n = online > 0 ? (int)online : 1;
  }
#if defined(__linux__)
  const int quota = em_cgroup_limit();
  if (quota > 0 && quota < n) n = quota;
#endif
  if (n > EM_MAX_THREADS) n = EM_MAX_THREADS;
  atomic_store_explicit(&em_default_threads_cached, n, memory_order_relaxed);
  return n;
}

EMBER_EXPORT int ember_get_num_threads(void) {
  const int n = atomic_load_explicit(&em_requested_threads, memory_order_relaxed);
  if (n > 0) return n < EM_MAX_THREADS ? n : EM_MAX_THREADS;
  return em_default_threads();
}

/* ---- claiming and running chunks ---- */

/* Take the next free chunk of the loop of generation gen; 0 when none is left (or the loop
   is no longer the current one). */
static int em_claim(uint32_t gen, int64_t *begin, int64_t *end) {
  uint64_t t = atomic_load_explicit(&em_pool.ticket, memory_order_acquire);
  for (;;) {
    if (em_ticket_generation(t) != gen || em_ticket_next(t) >= em_ticket_chunks(t)) return 0;
    if (atomic_compare_exchange_weak_explicit(&em_pool.ticket, &t, t + 1,
                                              memory_order_acq_rel, memory_order_acquire)) {
      const int64_t chunk = atomic_load_explicit(&em_pool.chunk, memory_order_relaxed);
      const int64_t extent = atomic_load_explicit(&em_pool.extent, memory_order_relaxed);
      *begin = em_ticket_next(t) * chunk;
      *end = *begin + chunk < extent ? *begin + chunk : extent;
      return 1;
    }
  }
}

/* Run chunks of the loop of generation gen until none is left; workers count them done. */
static void em_run_chunks(uint32_t gen, int worker) {
  int64_t begin, end;
  while (em_claim(gen, &begin, &end)) {
    const em_task_fn fn = atomic_load_explicit(&em_pool.fn, memory_order_relaxed);
    void *context = atomic_load_explicit(&em_pool.context, memory_order_relaxed);
    const int64_t chunks = em_ticket_chunks(atomic_load_explicit(&em_pool.ticket,
                                                                 memory_order_relaxed));
    fn(context, begin, end);
    if (worker) em_count(2);
    if (atomic_fetch_add(&em_pool.done, 1) + 1 == chunks &&
        atomic_load(&em_pool.caller_sleeping)) {
      pthread_mutex_lock(&em_pool.lock);
      pthread_cond_signal(&em_pool.finished);
      pthread_mutex_unlock(&em_pool.lock);
    }
  }
}

/* ---- workers ---- */

/* Wait until a loop newer than generation seen is published: spin a while, then sleep.
   Returns 0 when the worker should exit (the pool stops, or it idled too long). */
static int em_worker_wait(uint32_t seen, uint64_t *ticket) {
  const int64_t start = em_now_ns();
  for (int i = 0;; ++i) {
    const uint64_t t = atomic_load_explicit(&em_pool.ticket, memory_order_acquire);
    if (em_ticket_generation(t) != seen) { *ticket = t; return 1; }
    if ((i & 63) != 63) {
      em_cpu_relax();
      continue;
    }
    const int64_t waited = em_now_ns() - start;
    if (waited > EM_WORKER_SPIN_NS) break;
    /* past the first microseconds, let any other thread of this core run first (the
       caller, when it shares the core: on a busy machine it often does) */
    if (waited > EM_PAUSE_SPIN_NS) sched_yield();
  }
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += EM_IDLE_EXIT_S;
  int go_on = 1;
  pthread_mutex_lock(&em_pool.lock);
  atomic_fetch_add(&em_pool.sleepers, 1);
  em_count(4);
  for (;;) {
    const uint64_t t = atomic_load(&em_pool.ticket);
    if (em_ticket_generation(t) != seen) { *ticket = t; break; }
    if (em_pool.stopping) { go_on = 0; break; }
    if (pthread_cond_timedwait(&em_pool.wake, &em_pool.lock, &deadline) == ETIMEDOUT &&
        em_ticket_generation(atomic_load(&em_pool.ticket)) == seen) {
      go_on = 0;
      break;
    }
  }
  atomic_fetch_sub(&em_pool.sleepers, 1);
  pthread_mutex_unlock(&em_pool.lock);
  return go_on;
}

static void *em_worker_main(void *arg) {
  const int id = (int)(intptr_t)arg;  /* 1 .. EM_MAX_THREADS - 1; the caller is 0 */
  em_in_pool = 1;
  uint32_t seen = em_pool.slot_seen[id - 1];  /* written before this thread was created */
  uint64_t t;
  while (em_worker_wait(seen, &t)) {
    seen = em_ticket_generation(t);
    if (id < atomic_load_explicit(&em_pool.participants, memory_order_relaxed))
      em_run_chunks(seen, 1);
  }
  pthread_mutex_lock(&em_pool.lock);
  em_pool.slot_state[id - 1] = EM_SLOT_EXITED;
  atomic_fetch_sub(&em_pool.live, 1);
  pthread_mutex_unlock(&em_pool.lock);
  return NULL;
}

/* ---- the pool's life: start workers, fork, unload ---- */

static void em_fork_prepare(void) { pthread_mutex_lock(&em_pool.lock); }
static void em_fork_parent(void) { pthread_mutex_unlock(&em_pool.lock); }

/* The child has only the forking thread: no workers, and nobody owns the pool. */
static void em_fork_child(void) {
  pthread_mutex_init(&em_pool.lock, NULL);
  pthread_cond_init(&em_pool.wake, NULL);
  pthread_cond_init(&em_pool.finished, NULL);
  for (int i = 0; i < EM_MAX_THREADS; ++i) em_pool.slot_state[i] = EM_SLOT_EMPTY;
  atomic_store(&em_pool.live, 0);
  atomic_store(&em_pool.sleepers, 0);
  atomic_store(&em_pool.caller_sleeping, 0);
  atomic_store(&em_pool.busy, 0);
  em_in_pool = 0;
}

static void em_register_fork_handlers(void) {
  pthread_atfork(em_fork_prepare, em_fork_parent, em_fork_child);
}

/* Start workers 1 .. wanted (those not running); a worker that cannot be started is left
   out: the loop then runs on fewer threads. */
static void em_start_workers(int wanted) {
  pthread_once(&em_fork_once, em_register_fork_handlers);
  pthread_mutex_lock(&em_pool.lock);
  if (!em_pool.stopping) {
    pthread_attr_t attr;
    size_t stack = 0;
    pthread_attr_init(&attr);
    if (pthread_attr_getstacksize(&attr, &stack) == 0 && stack < ((size_t)8 << 20))
      pthread_attr_setstacksize(&attr, (size_t)8 << 20);  /* kernels keep scratch there */
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);  /* signals go to the user's threads */
    for (int slot = 0; slot < wanted; ++slot) {
      if (em_pool.slot_state[slot] == EM_SLOT_RUNNING) continue;
      if (em_pool.slot_state[slot] == EM_SLOT_EXITED) pthread_join(em_pool.slots[slot], NULL);
      em_pool.slot_state[slot] = EM_SLOT_EMPTY;
      em_pool.slot_seen[slot] = em_ticket_generation(atomic_load(&em_pool.ticket));
      if (pthread_create(&em_pool.slots[slot], &attr, em_worker_main,
                         (void *)(intptr_t)(slot + 1)) != 0)
        break;
      em_pool.slot_state[slot] = EM_SLOT_RUNNING;
      atomic_fetch_add(&em_pool.live, 1);
      em_count(5);
    }
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    pthread_attr_destroy(&attr);
  }
  pthread_mutex_unlock(&em_pool.lock);
}

/* Unloading the library: its workers must not outlive its code.  It runs at every exit,
   also of a program that never used the library because its CPU lacks the library's
   instruction set (an export for x86-64-v4 refuses to open on an AVX2 machine): so on x86 it
   is compiled for the baseline, whatever -march the library has. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define EM_BASELINE_CODE __attribute__((target("arch=x86-64")))
#else
#define EM_BASELINE_CODE
#endif
__attribute__((destructor)) EM_BASELINE_CODE static void em_stop_workers(void) {
  int started[EM_MAX_THREADS];
  pthread_mutex_lock(&em_pool.lock);
  em_pool.stopping = 1;
  for (int slot = 0; slot < EM_MAX_THREADS; ++slot)
    started[slot] = em_pool.slot_state[slot] != EM_SLOT_EMPTY;
  pthread_cond_broadcast(&em_pool.wake);
  pthread_mutex_unlock(&em_pool.lock);
  for (int slot = 0; slot < EM_MAX_THREADS; ++slot)
    if (started[slot]) pthread_join(em_pool.slots[slot], NULL);
}

/* ---- the caller ---- */

/* Wait until every chunk of the loop is done: spin a while (yielding, past the first
   microseconds, to a worker that shares this core), then sleep, which frees this core for a
   worker that was preempted in the middle of its chunk. */
static void em_wait_done(int64_t chunks) {
  const int64_t start = em_now_ns();
  for (int i = 0; atomic_load_explicit(&em_pool.done, memory_order_acquire) != chunks; ++i) {
    if ((i & 63) != 63) {
      em_cpu_relax();
      continue;
    }
    const int64_t waited = em_now_ns() - start;
    if (waited > EM_PAUSE_SPIN_NS) sched_yield();
    if (waited > EM_CALLER_SPIN_NS) {
      pthread_mutex_lock(&em_pool.lock);
      atomic_store(&em_pool.caller_sleeping, 1);
      em_count(3);
      while (atomic_load(&em_pool.done) != chunks)
        pthread_cond_wait(&em_pool.finished, &em_pool.lock);
      atomic_store(&em_pool.caller_sleeping, 0);
      pthread_mutex_unlock(&em_pool.lock);
      return;
    }
  }
}

/* Run fn(context, begin, end) over [0, extent) in chunks of `chunk` iterations (0: the pool
   picks a few chunks per thread) on the caller and the pool's workers; returns when every
   chunk is done. */
EMBER_INTERNAL void em_parallel_for(em_task_fn fn, void *context, int64_t extent,
                                    int64_t chunk) {
  if (extent <= 0) return;
  const int threads = ember_get_num_threads();
  int expected = 0;
  if (threads <= 1 || extent == 1 || em_in_pool ||
      !atomic_compare_exchange_strong(&em_pool.busy, &expected, 1)) {
    em_count(1);
    fn(context, 0, extent);
    return;
  }
  if (atomic_load_explicit(&em_pool.live, memory_order_relaxed) < threads - 1)
    em_start_workers(threads - 1);
  if (chunk <= 0) {
    const int64_t parts = (int64_t)threads * EM_CHUNKS_PER_THREAD;
    chunk = (extent + parts - 1) / parts;
  }
  if ((extent + chunk - 1) / chunk > EM_MAX_CHUNKS)
    chunk = (extent + EM_MAX_CHUNKS - 1) / EM_MAX_CHUNKS;
  const int64_t chunks = (extent + chunk - 1) / chunk;
  atomic_store_explicit(&em_pool.fn, fn, memory_order_relaxed);
  atomic_store_explicit(&em_pool.context, context, memory_order_relaxed);
  atomic_store_explicit(&em_pool.extent, extent, memory_order_relaxed);
  atomic_store_explicit(&em_pool.chunk, chunk, memory_order_relaxed);
  atomic_store_explicit(&em_pool.participants, threads, memory_order_relaxed);
  atomic_store_explicit(&em_pool.done, 0, memory_order_relaxed);
  const uint32_t gen = (em_ticket_generation(atomic_load(&em_pool.ticket)) + 1) & 0xFFFFFF;
  atomic_store(&em_pool.ticket, ((uint64_t)gen << 40) | ((uint64_t)chunks << EM_CHUNK_BITS));
  if (atomic_load(&em_pool.sleepers) > 0) {
    pthread_mutex_lock(&em_pool.lock);
    pthread_cond_broadcast(&em_pool.wake);
    pthread_mutex_unlock(&em_pool.lock);
  }
  em_count(0);
  em_in_pool = 1;
  em_run_chunks(gen, 0);
  em_in_pool = 0;
  em_wait_done(chunks);
  atomic_store_explicit(&em_pool.busy, 0, memory_order_release);
}

#else  /* no threads: every loop runs in its caller */

EMBER_EXPORT int ember_get_num_threads(void) { return 1; }

EMBER_INTERNAL void em_parallel_for(em_task_fn fn, void *context, int64_t extent,
                                    int64_t chunk) {
  (void)chunk;
  em_count(1);
  if (extent > 0) fn(context, 0, extent);
}

#endif"""
