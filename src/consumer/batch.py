"""A batch from Lambda's SQS event source: lanes in parallel, messages in a lane in order.

A lane is what must not run concurrently. On a standard queue: messages with the
same idempotency key (so a duplicate inside the batch reuses the first one's outcome
without touching DynamoDB), and messages whose handler names the same contended
business item (so they do not race for it in transactions DynamoDB would cancel).
On a FIFO queue it is one ``MessageGroupId``: its messages run in order and the first
failure stops the group, with every later message of the group reported too, as SQS
FIFO ordering requires.

A lane with a lock-mode message runs on a thread of its own (the invocation's or the pool's): its handler may wait
on the network under its lease, and nothing else may wait behind it. The lanes whose messages never wait outside
the store (optimistic handlers are pure; a dead letter is one send) are interleaved on the invocation's thread:
each one's next message runs up to its transition, and those transitions are sent together. Either way each message
lives the same life (``MessageProcessor.begin``); only how many lives a thread holds differs.

Near the invocation's deadline no new message is started; unstarted messages are
reported as failures, so SQS delivers them again.

Only a malformed event raises (not a list of SQS messages): that is the caller's
bug, not a message's, and Lambda should fail the invocation loudly.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from consumer.backoff import VisibilityBackoff
from consumer.envelope import SqsMessage
from consumer.handler import Mode
from consumer.idempotency.observer import Grouping, Tally
from consumer.outcome import MessageResult, Outcome
from consumer.prepared import Parsed, Prepared
from consumer.processor import Life, MessageProcessor


@dataclass(frozen=True)
class BatchResult:
    results: tuple[MessageResult, ...]
    # The transactions its messages' transitions were sent in.
    grouping: Grouping = field(default_factory=Grouping)

    def failures(self) -> list[str]:
        return [result.message_id for result in self.results if result.outcome.is_failure]

    def response(self) -> dict[str, list[dict[str, str]]]:
        """The partial batch response Lambda expects with ``ReportBatchItemFailures``."""
        return {"batchItemFailures": [{"itemIdentifier": message_id} for message_id in self.failures()]}

    def counts(self) -> Counter[Outcome]:
        return Counter(result.outcome for result in self.results)

    def conflicts_absorbed(self) -> int:
        return self.grouping.conflicts_absorbed


def sqs_messages(messages: object) -> list[SqsMessage]:
    """An event's ``Records``, checked; ``ValueError`` when they are not SQS messages at all."""
    if not isinstance(messages, list):
        raise ValueError("event has no 'Records' list: this function takes SQS events only")
    seen: set[str] = set()
    for index, message in enumerate(messages):
        if (
            not isinstance(message, Mapping)
            or not isinstance(message.get("messageId"), str)
            or not message["messageId"]
        ):
            raise ValueError(f"message {index} has no messageId: not an SQS message")
        if message["messageId"] in seen:
            raise ValueError(f"messageId {message['messageId']} appears twice in one batch")
        seen.add(message["messageId"])
    return messages


def _lanes(items: list[Prepared], fifo: bool) -> list[list[int]]:
    """Indexes of the messages that must run one after another, each lane in batch order, the lanes in the order of
    their first message.

    Messages sharing a key join one lane, transitively: each key leads to the first message that named it, and lanes
    are merged by their lowest index (union-find), so a batch of 10,000 costs linear work, not a search of every lane
    per message.
    """
    parent = list(range(len(items)))

    def lane_of(index: int) -> int:
        while parent[index] != index:
            parent[index] = index = parent[parent[index]]
        return index

    first_with: dict[str, int] = {}
    for index, item in enumerate(items):
        if fifo:
            keys = ["group:" + (item.group or "")]
        elif isinstance(item.state, Parsed):
            keys = ["key:" + item.state.message.record_id]
            if item.state.contention_key is not None:
                keys.append("item:" + item.state.contention_key)
        else:
            keys = ["message:" + item.message_id]
        for key in keys:
            joined, own = lane_of(first_with.setdefault(key, index)), lane_of(index)
            parent[max(joined, own)] = min(joined, own)
    lanes: dict[int, list[int]] = {}
    for index in range(len(items)):
        lanes.setdefault(lane_of(index), []).append(index)
    return list(lanes.values())


@dataclass(eq=False)
class _Lane:
    """A lane's progress: held by one thread, so never locked."""

    indexes: list[int]
    done: int = 0  # how many of its messages, in order, have their result
    stopped_by: str | None = None
    # (record id, payload hash) -> the outcome of its first execution in this batch.
    first_runs: dict[tuple[str, str], MessageResult] = field(default_factory=dict)


class BatchRunner:
    def __init__(
        self,
        processor: MessageProcessor,
        *,
        max_workers: int,
        deadline_margin_ms: int,
        backoff: VisibilityBackoff | None = None,
        clock: Callable[[], float] = time.time,
        tally: Tally,
    ) -> None:
        self._processor = processor
        self._tally = tally
        self._backoff = backoff
        self._max_workers = max_workers
        self._deadline_margin_ms = deadline_margin_ms
        self._clock = clock
        # One pool per container, beside the invocation's own thread: threads are reused across warm invocations.
        self._pool: ThreadPoolExecutor | None = None

    def process(self, event_records: object, remaining_ms: Callable[[], int]) -> BatchResult:
        messages = sqs_messages(event_records)
        self._tally.take()  # what an earlier invocation left untaken is not this one's
        items = [self._processor.prepare(message) for message in messages]
        fifo = any(item.group for item in items)
        results: list[MessageResult | None] = [None] * len(messages)

        interleaved, threaded = deque[_Lane](), deque[_Lane]()
        for lane in _lanes(items, fifo):
            (threaded if any(_waits_outside(items[index]) for index in lane) else interleaved).append(_Lane(lane))

        def work() -> None:
            """Lanes of their own thread, one after another, until none is left."""
            while True:
                try:
                    lane = threaded.popleft()
                except IndexError:
                    return
                while (index := self._next(lane, items, results, fifo, remaining_ms)) is not None:
                    self._settle(lane, items, results, fifo, index, self._processor.execute(items[index], remaining_ms))

        def pooled() -> None:
            try:
                work()
            finally:
                self._processor.leave()

        # Every thread joins before any starts, so that the first transitions wait (bounded) for the others'.
        workers = min(len(threaded) + (1 if interleaved else 0), self._max_workers)
        self._processor.join(workers)
        futures = [self._executor().submit(pooled) for _ in range(workers - 1)]
        try:
            if workers:
                try:  # the invocation's own thread is one of them
                    self._interleave(interleaved, items, results, fifo, remaining_ms)
                    work()
                finally:
                    self._processor.leave()
        finally:
            # Whatever escapes a lane (a BaseException: nothing of a message's catches it) escapes once every lane
            # has ended: no thread of this batch goes on into the next invocation.
            wait(futures)
        for future in futures:
            future.result()
        done = tuple(result for result in results if result is not None)
        assert len(done) == len(messages), "every message ends with exactly one result"
        if self._backoff is not None:
            self._backoff.schedule(messages, done)
        return BatchResult(done, self._tally.take())

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._max_workers - 1, thread_name_prefix="message")
        return self._pool

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _next(
        self,
        lane: _Lane,
        items: list[Prepared],
        results: list[MessageResult | None],
        fifo: bool,
        remaining_ms: Callable[[], int],
    ) -> int | None:
        """The index of the lane's next message to run, None when none is left; the messages before it that need no
        run of their own are settled on the way (after a FIFO failure, near the deadline, a copy of an earlier one)."""
        while lane.done < len(lane.indexes):
            index = lane.indexes[lane.done]
            item = items[index]
            if lane.stopped_by is None and remaining_ms() < self._deadline_margin_ms:
                lane.stopped_by = "not started: the invocation is about to time out"
            if lane.stopped_by is not None:
                result = MessageResult(item.message_id, Outcome.RETRIED, lane.stopped_by, retry_at_ms=self._now_ms())
            elif (first := lane.first_runs.get(_copy_of(item))) is not None:
                try:
                    result = self._processor.reuse(item, first)
                except Exception as error:  # never let one message fail the whole batch
                    result = MessageResult(item.message_id, Outcome.RETRIED, f"{type(error).__name__}: {error}")
            else:
                return index
            self._settle(lane, items, results, fifo, index, result)
        return None

    @staticmethod
    def _settle(
        lane: _Lane,
        items: list[Prepared],
        results: list[MessageResult | None],
        fifo: bool,
        index: int,
        result: MessageResult,
    ) -> None:
        item = items[index]
        results[index] = result
        lane.done += 1
        lane.first_runs.setdefault(_copy_of(item), result)
        if fifo and result.outcome.is_failure and lane.stopped_by is None:
            lane.stopped_by = f"not started: earlier message {item.message_id} of group {item.group} failed"

    def _interleave(
        self,
        lanes: deque[_Lane],
        items: list[Prepared],
        results: list[MessageResult | None],
        fifo: bool,
        remaining_ms: Callable[[], int],
    ) -> None:
        """Lanes whose messages never wait outside the store, on this one thread: each lane's next message runs until
        it waits on a transition, the transitions they wait on are sent together, until every lane ends."""
        running: list[tuple[_Lane, int, Life]] = []
        ready = list(lanes)
        while ready or running:
            for lane in ready:
                while (index := self._next(lane, items, results, fifo, remaining_ms)) is not None:
                    life = self._processor.begin(items[index], remaining_ms)
                    if life.result is None:
                        running.append((lane, index, life))
                        break
                    self._settle(lane, items, results, fifo, index, life.result)
            if not running:
                return
            self._processor.step([life for _, _, life in running], remaining_ms)
            ready = []
            for lane, index, life in running:
                if life.result is not None:
                    self._settle(lane, items, results, fifo, index, life.result)
                    ready.append(lane)
            running = [entry for entry in running if entry[2].result is None]


def _waits_outside(item: Prepared) -> bool:
    """A lock-mode message: its guard and handler may wait on the network, under its lease."""
    return isinstance(item.state, Parsed) and item.state.handler.mode is Mode.LOCK


def _copy_of(item: Prepared) -> tuple[str, str]:
    """What makes two messages copies of one (their key and payload), or the message's own id if it has none."""
    if isinstance(item.state, Parsed):
        return item.state.message.record_id, item.state.message.payload_hash
    return "message", item.message_id
