"""Dynamic batching: one queue per model, batches formed as workers free up.

The policy, per model (:class:`BatchPolicy`):

* A request waits in a bounded queue (``max_queue`` requests; one more is refused with 429).
* When a worker is free, the oldest request and the later ones of its batch key (the same
  shapes; see :mod:`ember.serve.model`) form a batch of at most ``max_batch`` samples.
* The batch runs at once when it reaches ``preferred_batch`` samples, when its oldest request
  has waited ``max_queue_delay`` seconds, or when every worker is idle: on a CPU an idle core
  gains more than a bigger batch, so a lone request on an idle server never waits for company.
  Otherwise (other workers busy, the batch still small) the free worker waits for more
  requests, up to the oldest one's delay.  With one worker this is "continuous" batching:
  whatever queued while the worker ran forms the next batch.
* ``max_batch`` bounds only a batch of several requests: one request of more samples runs
  alone, in the model's own blocks.  No other limit caps a batch.

The event loop owns the queue; each worker is a thread of its own that runs the model's calls
(the compiled code releases the GIL).  A request's result goes back to the future it waits
on, so every response belongs to its request; one whose client gave up (timeout) is dropped
from the queue, or its result discarded.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ember.serve.metrics import ServerMetrics
from ember.serve.model import Prepared, Result, ServedModel
from ember.serve.protocol import ProtocolError


@dataclass(frozen=True)
class BatchPolicy:
    """How requests for one model queue and batch (see the module doc)."""

    max_batch: int = 32
    preferred_batch: int | None = None  # default: max_batch
    max_queue_delay: float = 0.002  # seconds
    max_queue: int = 256

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {self.max_batch}")
        if self.preferred_batch is not None and not 1 <= self.preferred_batch:
            raise ValueError(f"preferred_batch must be at least 1, not {self.preferred_batch}")
        if self.max_queue_delay < 0:
            raise ValueError(f"max_queue_delay must be >= 0, not {self.max_queue_delay}")
        if self.max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, not {self.max_queue}")

    @property
    def fill(self) -> int:
        """The samples at which a batch runs without waiting."""
        return min(self.preferred_batch or self.max_batch, self.max_batch)


@dataclass(eq=False)
class _Pending:
    prepared: Prepared
    future: asyncio.Future
    enqueued: float = field(default_factory=time.monotonic)


class ModelQueue:
    """The queue, dispatcher and workers of one model."""

    def __init__(self, model: ServedModel, policy: BatchPolicy, metrics: ServerMetrics):
        self.model = model
        self.policy = policy
        self._metrics = metrics
        self._queue: deque[_Pending] = deque()
        self._workers = len(model.instances)
        # One single-thread executor per worker: a copy is always called from the same
        # thread, the caller its thread pool counts on.
        self._executors = [ThreadPoolExecutor(1, thread_name_prefix=f"ember-{model.name}-{i}")
                           for i in range(self._workers)]
        self._idle = list(range(self._workers))
        self._accepting = True
        self._wake: asyncio.Event | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._dispatcher: asyncio.Task | None = None
        self._running: set[asyncio.Future] = set()
        self._label = metrics.queue_depth.labels(model.name)

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._dispatcher = asyncio.create_task(self._dispatch(), name=f"ember-{self.model.name}")

    async def infer(self, prepared: Prepared, timeout: float) -> dict:
        """Queue a checked request and wait for its outputs (a :class:`ProtocolError` of 429
        when the queue is full, 503 while shutting down, 504 after ``timeout`` seconds)."""
        if not self._accepting:
            raise ProtocolError(f"model '{self.model.name}' is shutting down", status=503,
                                kind="unavailable")
        if len(self._queue) >= self.policy.max_queue:
            raise ProtocolError(f"model '{self.model.name}' has {len(self._queue)} requests "
                                f"queued, its limit; retry later", status=429,
                                kind="queue_full")
        pending = _Pending(prepared, asyncio.get_running_loop().create_future())
        self._queue.append(pending)
        self._label.set(len(self._queue))
        self._wake.set()
        try:
            result = await asyncio.wait_for(asyncio.shield(pending.future), timeout)
        except TimeoutError:
            pending.future.cancel()  # still queued: dropped; running: its result discarded
            raise ProtocolError(f"model '{self.model.name}' did not answer within "
                                f"{timeout:g} s", status=504, kind="timeout") from None
        except asyncio.CancelledError:  # the handler was cancelled: its request goes too
            pending.future.cancel()
            raise
        if isinstance(result, BaseException):
            raise result
        return result

    async def close(self) -> None:
        """Refuse new requests, answer every queued and running one, stop the workers."""
        self._accepting = False
        if self._wake is not None:
            self._wake.set()
        while self._queue or self._running:
            await asyncio.sleep(0.005)
        if self._dispatcher is not None:
            self._dispatcher.cancel()
        for executor in self._executors:
            executor.shutdown(wait=True)

    # ---------------------------------------------------------------- dispatching
    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._idle and self._queue:
                batch, wait_until = self._take_batch()
                if batch is None:
                    if wait_until is not None:
                        self._wake_at(loop, wait_until)
                    break
                worker = self._idle.pop()
                self._start(loop, worker, batch)

    def _take_batch(self) -> tuple[list[_Pending] | None, float | None]:
        """The next batch to run now, or (None, the time to look again)."""
        queue = self._queue
        while queue and queue[0].future.done():  # its client gave up
            queue.popleft()
        if not queue:
            return None, None
        oldest = queue[0]
        key = oldest.prepared.key
        chosen = [oldest]
        samples = oldest.prepared.samples
        for pending in list(queue)[1:]:
            if samples >= self.policy.max_batch:
                break
            if pending.prepared.key != key or pending.future.done():
                continue
            if samples + pending.prepared.samples > self.policy.max_batch:
                continue
            chosen.append(pending)
            samples += pending.prepared.samples
        now = time.monotonic()
        deadline = oldest.enqueued + self.policy.max_queue_delay
        ready = (samples >= self.policy.fill or len(self._idle) == self._workers
                 or now >= deadline or not self._accepting or not self.model.batchable)
        if not ready:
            return None, deadline
        taken = set(map(id, chosen))
        self._queue = deque(p for p in queue if id(p) not in taken and not p.future.done())
        self._label.set(len(self._queue))
        return chosen, None

    def _wake_at(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, when - time.monotonic())
        self._timer = loop.call_later(delay, self._wake.set)

    def _start(self, loop: asyncio.AbstractEventLoop, worker: int, batch: list[_Pending]
               ) -> None:
        name = self.model.name
        started = time.monotonic()
        for pending in batch:
            self._metrics.queue_delay.labels(name).observe(started - pending.enqueued)
        self._metrics.batch_size.labels(name).observe(sum(p.prepared.samples for p in batch))
        self._metrics.batch_requests.labels(name).observe(len(batch))
        future = loop.run_in_executor(self._executors[worker], self.model.run_batch, worker,
                                      [p.prepared for p in batch])
        self._running.add(future)

        def finished(done: asyncio.Future) -> None:
            self._running.discard(done)
            self._metrics.inference.labels(name).observe(time.monotonic() - started)
            try:
                results: list[Result] = done.result()
            except BaseException as error:  # a bug in the batch code: every request gets it
                results = [error] * len(batch)
            for pending, result in zip(batch, results):
                if not pending.future.done():
                    pending.future.set_result(result)
            self._idle.append(worker)
            self._wake.set()

        future.add_done_callback(finished)
