"""The batching policy, on a stand-in model whose calls block until the test lets them
finish: which requests form each batch, when a batch waits, what a full queue, a timeout and a
shutdown do.  Deterministic: nothing here depends on how fast the machine is."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ember.serve.batcher import BatchPolicy, ModelQueue
from ember.serve.metrics import ServerMetrics
from ember.serve.model import Prepared
from ember.serve.protocol import ProtocolError


class GatedModel:
    """Records each call's requests; a call returns when its gate opens."""

    def __init__(self, workers: int = 1, batchable: bool = True):
        self.name = "gated"
        self.instances = [object()] * workers
        self.batchable = batchable
        self.calls: list[list[str]] = []
        self.gates: list[threading.Event] = []
        self.started = threading.Semaphore(0)

    def run_batch(self, worker: int, batch: list[Prepared]) -> list[dict]:
        gate = threading.Event()
        self.calls.append([item.request for item in batch])
        self.gates.append(gate)
        self.started.release()
        assert gate.wait(10)
        return [{"who": item.request, "worker": worker} for item in batch]

    def open_all(self) -> None:
        for gate in self.gates:
            gate.set()


def request(name: str, samples: int = 1, key: str = "k") -> Prepared:
    return Prepared(request=name, inputs={}, samples=samples, key=key, outputs=[])


async def until_started(model: GatedModel, calls: int) -> None:
    while len(model.calls) < calls:
        await asyncio.sleep(0.001)


async def open_gates_until_done(model: GatedModel, tasks) -> None:
    """Let every call finish (each new one too) until ``tasks`` are done."""
    while any(not task.done() for task in tasks):
        model.open_all()
        await asyncio.sleep(0.005)


async def busy_queue(policy: BatchPolicy, first: str = "first"
                     ) -> tuple[GatedModel, ModelQueue, list[asyncio.Task]]:
    """A started queue of one worker, busy with the call of request ``first`` (gated)."""
    model = GatedModel()
    queue = ModelQueue(model, policy, ServerMetrics())
    await queue.start()
    tasks = [asyncio.create_task(queue.infer(request(first), 10))]
    await until_started(model, 1)
    return model, queue, tasks


def run(test):
    return asyncio.run(asyncio.wait_for(test(), 30))


def test_a_lone_request_on_an_idle_server_runs_at_once():
    """An idle worker takes a lone request without waiting for company, even with a long
    queue delay."""
    async def scenario():
        model = GatedModel()
        queue = ModelQueue(model, BatchPolicy(max_batch=8, max_queue_delay=5.0),
                           ServerMetrics())
        await queue.start()
        task = asyncio.create_task(queue.infer(request("a"), 10))
        start = time.monotonic()
        await until_started(model, 1)
        assert time.monotonic() - start < 1.0
        model.open_all()
        assert (await task)["who"] == "a"
        await queue.close()
    run(scenario)


def test_requests_queued_behind_a_call_form_the_next_batch_by_key_and_size():
    async def scenario():
        model, queue, tasks = await busy_queue(BatchPolicy(max_batch=4), "first")
        # queued while the worker is busy: keys k and q, samples 1..3
        for name, samples, key in [("b", 1, "k"), ("c", 2, "q"), ("d", 2, "k"),
                                   ("e", 3, "k"), ("f", 1, "k"), ("g", 1, "q")]:
            tasks.append(asyncio.create_task(queue.infer(request(name, samples, key), 10)))
        await asyncio.sleep(0.01)
        await open_gates_until_done(model, tasks)
        results = [await t for t in tasks]
        await queue.close()
        # b (k), then d (k, 1+2 = 3 <= 4), e does not fit (3 + 3 > 4), f fits (4)
        assert model.calls == [["first"], ["b", "d", "f"], ["c", "g"], ["e"]]
        assert [r["who"] for r in results] == ["first", "b", "c", "d", "e", "f", "g"]
    run(scenario)


def test_a_request_larger_than_the_batch_limit_runs_alone():
    async def scenario():
        model, queue, tasks = await busy_queue(BatchPolicy(max_batch=4), "first")
        tasks += [asyncio.create_task(queue.infer(request("big", 9), 10)),
                  asyncio.create_task(queue.infer(request("small", 1), 10))]
        await asyncio.sleep(0.01)
        await open_gates_until_done(model, tasks)
        await queue.close()
        assert model.calls == [["first"], ["big"], ["small"]]
    run(scenario)


def test_a_free_worker_waits_up_to_the_delay_while_another_is_busy():
    """Two workers, one busy: a lone request waits for company up to max_queue_delay (and no
    longer), and runs at once when the batch reaches the preferred size."""
    async def scenario():
        model = GatedModel(workers=2)
        delay = 0.3
        queue = ModelQueue(model, BatchPolicy(max_batch=8, preferred_batch=3,
                                              max_queue_delay=delay), ServerMetrics())
        await queue.start()
        busy = asyncio.create_task(queue.infer(request("busy"), 10))
        await until_started(model, 1)
        start = time.monotonic()
        lone = asyncio.create_task(queue.infer(request("lone"), 10))
        await until_started(model, 2)
        waited = time.monotonic() - start
        assert delay * 0.9 <= waited < delay + 2.0
        assert model.calls[1] == ["lone"]
        model.open_all()
        await lone
        # the preferred size is reached before the delay: runs then
        start = time.monotonic()
        group = [asyncio.create_task(queue.infer(request(n), 10)) for n in "xyz"]
        await until_started(model, 3)
        assert time.monotonic() - start < delay * 0.9
        assert model.calls[2] == ["x", "y", "z"]
        model.open_all()
        await asyncio.gather(busy, *group)
        await queue.close()
    run(scenario)


def test_models_without_a_batch_axis_run_each_request_alone():
    async def scenario():
        model = GatedModel(batchable=False)
        queue = ModelQueue(model, BatchPolicy(max_batch=8), ServerMetrics())
        await queue.start()
        tasks = [asyncio.create_task(queue.infer(request(n, key=object()), 10))
                 for n in "abc"]
        await open_gates_until_done(model, tasks)
        await queue.close()
        assert model.calls == [["a"], ["b"], ["c"]]
    run(scenario)


def test_a_full_queue_refuses_with_429_and_the_accepted_ones_are_answered():
    async def scenario():
        model, queue, tasks = await busy_queue(BatchPolicy(max_batch=1, max_queue=2), "running")
        tasks += [asyncio.create_task(queue.infer(request(f"q{i}"), 10)) for i in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(ProtocolError) as refused:
            await queue.infer(request("one too many"), 10)
        assert refused.value.status == 429 and "queued" in str(refused.value)
        await open_gates_until_done(model, tasks)
        assert [(await t)["who"] for t in tasks] == ["running", "q0", "q1"]
        await queue.close()
    run(scenario)


def test_a_request_that_times_out_gets_504_and_is_never_run():
    async def scenario():
        model = GatedModel()
        queue = ModelQueue(model, BatchPolicy(max_batch=1), ServerMetrics())
        await queue.start()
        running = asyncio.create_task(queue.infer(request("running"), 10))
        await until_started(model, 1)
        with pytest.raises(ProtocolError) as late:
            await queue.infer(request("late"), 0.05)
        assert late.value.status == 504
        model.open_all()
        await running
        after = asyncio.create_task(queue.infer(request("after"), 10))
        await open_gates_until_done(model, [after])
        await queue.close()
        assert model.calls == [["running"], ["after"]]
    run(scenario)


def test_close_answers_every_queued_request_and_then_refuses_new_ones():
    async def scenario():
        model = GatedModel()
        queue = ModelQueue(model, BatchPolicy(max_batch=2), ServerMetrics())
        await queue.start()
        tasks = [asyncio.create_task(queue.infer(request(f"r{i}"), 10)) for i in range(5)]
        await until_started(model, 1)
        closing = asyncio.create_task(queue.close())
        await asyncio.sleep(0.01)
        with pytest.raises(ProtocolError) as refused:
            await queue.infer(request("new"), 10)
        assert refused.value.status == 503
        await open_gates_until_done(model, [closing])
        assert [(await t)["who"] for t in tasks] == [f"r{i}" for i in range(5)]
    run(scenario)


@pytest.mark.parametrize("fields", [{"max_batch": 0}, {"max_queue": 0},
                                    {"max_queue_delay": -1.0}, {"preferred_batch": 0}])
def test_a_policy_out_of_range_is_refused(fields):
    with pytest.raises(ValueError):
        BatchPolicy(**fields)


def test_a_request_whose_client_went_away_is_never_run():
    async def scenario():
        model, queue, tasks = await busy_queue(BatchPolicy(max_batch=1))
        gone = asyncio.create_task(queue.infer(request("gone"), 10))
        await asyncio.sleep(0.01)
        gone.cancel()  # its handler cancelled (a server may cancel it when the client leaves)
        tasks.append(asyncio.create_task(queue.infer(request("after"), 10)))
        await open_gates_until_done(model, tasks)
        await queue.close()
        assert model.calls == [["first"], ["after"]]
    run(scenario)
