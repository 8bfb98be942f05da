"""Dynamic batching: the instances that concurrent requests bring to one model graph run on it together.

Each request runs its method's Python stages on its own, as soon as it arrives; at a model stage its
checked instances join the graph's batcher, so one slow instance's preprocessing (a large image) delays
no other request's batch. A batch starts when a run slot is free. While another batch is running it
waits at most `max_wait_s` for more instances unless it already holds `max_batch`; an idle batcher runs at
once, so a lone client pays no batching delay. Each request gets back exactly its own instances' results,
in order.
"""
import asyncio
import collections
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Deque, List, Optional, Tuple

RunBatch = Callable[[List[Any]], Awaitable[List[Any]]]
RUNNING_BATCHES = 2  # one batch runs on the graph while the next one gathers


@dataclass(frozen=True)
class BatchPolicy:
    """How model stages batch (`mindvl serve --max-batch-size/--max-wait-ms`); `on_batch(servable, graph,
    size)` sees each executed batch (the batch-size metric)."""

    max_batch: int
    max_wait_s: float
    on_batch: Callable[[str, str, int], None] = lambda servable, graph, size: None


class Batcher:
    def __init__(self, run: RunBatch, max_batch: int, max_wait_s: float,
                 on_batch: Optional[Callable[[int], None]] = None, running: int = RUNNING_BATCHES) -> None:
        self.run = run
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.on_batch = on_batch or (lambda size: None)
        self.waiting: Deque[Tuple[List[Any], asyncio.Future]] = collections.deque()
        self.arrived = asyncio.Event()
        self.slots = asyncio.Semaphore(running)
        self.collector: Optional[asyncio.Task] = None
        self.running: set = set()

    async def submit(self, instances: List[Any]) -> List[Any]:
        """The results of `instances`, run in a batch with other requests' instances."""
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((instances, future))
        self.arrived.set()
        if self.collector is None:
            self.collector = asyncio.create_task(self._collect())
        return await future

    def _queued(self) -> int:
        return sum(len(instances) for instances, future in self.waiting if not future.done())

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self.waiting:
                self.arrived.clear()
                await self.arrived.wait()
            await self.slots.acquire()
            deadline = loop.time() + (self.max_wait_s if self.running else 0.0)
            while self._queued() < self.max_batch and loop.time() < deadline:
                self.arrived.clear()
                try:
                    await asyncio.wait_for(self.arrived.wait(), deadline - loop.time())
                except asyncio.TimeoutError:
                    break
            batch = self._take()
            if not batch:
                self.slots.release()
                continue
            task = asyncio.create_task(self._run(batch))
            self.running.add(task)
            task.add_done_callback(self.running.discard)

    def _take(self) -> List[Tuple[List[Any], asyncio.Future]]:
        """Requests from the front up to max_batch instances (at least one request, however large)."""
        batch, count = [], 0
        while self.waiting:
            instances, future = self.waiting[0]
            if future.done():  # timed out or cancelled while waiting
                self.waiting.popleft()
                continue
            if batch and count + len(instances) > self.max_batch:
                break
            batch.append(self.waiting.popleft())
            count += len(instances)
        return batch

    async def _run(self, batch: List[Tuple[List[Any], asyncio.Future]]) -> None:
        try:
            instances = [instance for request, _ in batch for instance in request]
            self.on_batch(len(instances))
            try:
                results = await self.run(instances)
            except Exception as error:  # the whole batch failed: each request reads why
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                return
            start = 0
            for request, future in batch:
                if not future.done():
                    future.set_result(results[start:start + len(request)])
                start += len(request)
        finally:
            self.slots.release()

    async def close(self) -> None:
        if self.collector is not None:
            self.collector.cancel()
            await asyncio.gather(self.collector, return_exceptions=True)
        await asyncio.gather(*self.running, return_exceptions=True)
        for _, future in self.waiting:
            if not future.done():
                future.cancel()
