"""A batch from Lambda's SQS event source: lanes in parallel, messages in a lane in order.

A lane is what must not run concurrently. On a standard queue: messages with the
same idempotency key (so a duplicate inside the batch reuses the first one's outcome
without touching DynamoDB), and messages whose handler names the same contended
business item (so they do not race for it in transactions DynamoDB would cancel).
On a FIFO queue it is one ``MessageGroupId``: its messages run in order and the first
failure stops the group, with every later message of the group reported too, as SQS
FIFO ordering requires.

Near the invocation's deadline no new message is started; unstarted messages are
reported as failures, so SQS delivers them again.

Only a malformed event raises (not a list of SQS messages): that is the caller's
bug, not a message's, and Lambda should fail the invocation loudly.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from consumer.backoff import VisibilityBackoff
from consumer.envelope import SqsMessage
from consumer.outcome import MessageResult, Outcome
from consumer.prepared import Parsed, Prepared
from consumer.processor import MessageProcessor


@dataclass(frozen=True)
class BatchResult:
    results: tuple[MessageResult, ...]

    def failures(self) -> list[str]:
        return [result.message_id for result in self.results if result.outcome.is_failure]

    def response(self) -> dict[str, list[dict[str, str]]]:
        """The partial batch response Lambda expects with ``ReportBatchItemFailures``."""
        return {"batchItemFailures": [{"itemIdentifier": message_id} for message_id in self.failures()]}

    def counts(self) -> Counter[Outcome]:
        return Counter(result.outcome for result in self.results)

    def conflicts_absorbed(self) -> int:
        return sum(result.conflicts_absorbed for result in self.results)


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
    """Indexes of the messages that must run one after another, each lane in batch order."""
    lanes: list[tuple[set[str], list[int]]] = []
    for index, item in enumerate(items):
        if fifo:
            keys = {"group:" + (item.group or "")}
        elif isinstance(item.state, Parsed):
            keys = {"key:" + item.state.message.record_id}
            if item.state.contention_key is not None:
                keys.add("item:" + item.state.contention_key)
        else:
            keys = {"message:" + item.message_id}
        joined = [lane for lane in lanes if lane[0] & keys]
        merged_keys, merged = set(keys), [index]
        for lane in joined:
            merged_keys |= lane[0]
            merged += lane[1]
            lanes.remove(lane)
        lanes.append((merged_keys, sorted(merged)))
    return [indexes for _, indexes in lanes]


class BatchRunner:
    def __init__(
        self,
        processor: MessageProcessor,
        *,
        max_workers: int,
        deadline_margin_ms: int,
        backoff: VisibilityBackoff | None = None,
        clock: Callable[[], float] = time.time,
        group_commit: bool = True,
    ) -> None:
        self._processor = processor
        # The lanes' first new optimistic messages committed together, in as few transactions as fit.
        self._group_commit = group_commit
        self._backoff = backoff
        self._max_workers = max_workers
        self._deadline_margin_ms = deadline_margin_ms
        self._clock = clock
        # One pool per container: threads are reused across warm invocations.
        self._pool: ThreadPoolExecutor | None = None

    def process(self, event_records: object, remaining_ms: Callable[[], int]) -> BatchResult:
        messages = sqs_messages(event_records)
        items = [self._processor.prepare(message) for message in messages]
        fifo = any(item.group for item in items)
        results: list[MessageResult | None] = [None] * len(messages)

        lanes = _lanes(items, fifo)
        heads = self._commit_heads(items, lanes, remaining_ms) if self._group_commit else {}

        def run(indexes: list[int]) -> None:
            lane = self._run_lane([items[i] for i in indexes], fifo, remaining_ms, heads.get(indexes[0]))
            for index, result in zip(indexes, lane, strict=True):
                results[index] = result

        if len(lanes) == 1 or self._max_workers == 1:
            for indexes in lanes:
                run(indexes)
        else:
            pool = self._executor()
            for future in [pool.submit(run, indexes) for indexes in lanes]:
                future.result()
        done = tuple(result for result in results if result is not None)
        assert len(done) == len(messages), "every message ends with exactly one result"
        if self._backoff is not None:
            self._backoff.schedule(messages, done)
        return BatchResult(done)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="message")
        return self._pool

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _commit_heads(
        self, items: list[Prepared], lanes: list[list[int]], remaining_ms: Callable[[], int]
    ) -> dict[int, MessageResult]:
        """The first message of each lane that can be grouped, committed together: their results, by index.

        Lanes hold apart what must not run together (a key's copies, a contended item, a FIFO group), so
        their first messages may share a transaction; the store still keeps apart those whose items meet.
        One such message alone gains nothing: it runs in its lane as before.
        """
        candidates = [lane[0] for lane in lanes if self._processor.groups(items[lane[0]])]
        if len(candidates) < 2:
            return {}
        starts: list[int] = []
        for index in candidates:
            # Each is started as its lane would start it: only with time left (its lane reports it if not).
            if remaining_ms() < self._deadline_margin_ms:
                break
            starts.append(index)
        if len(starts) < 2:
            return {}
        try:
            results = self._processor.execute_group([items[index] for index in starts], remaining_ms)
        except Exception as error:  # never let one group fail the whole batch: each message comes back
            reason = f"{type(error).__name__}: {error}"
            results = [MessageResult(items[index].message_id, Outcome.RETRIED, reason) for index in starts]
        return dict(zip(starts, results, strict=True))

    def _run_lane(
        self, items: list[Prepared], fifo: bool, remaining_ms: Callable[[], int], head: MessageResult | None = None
    ) -> list[MessageResult]:
        """Run a lane's messages in order; ``head``, its first message's result when the batch committed it already."""
        results: list[MessageResult] = []
        # (record id, payload hash) -> the outcome of its first execution in this batch.
        first_runs: dict[tuple[str, str], MessageResult] = {}
        stopped_by: str | None = None
        for item in items:
            message_id = item.message_id
            if stopped_by is not None:
                results.append(MessageResult(message_id, Outcome.RETRIED, stopped_by, retry_at_ms=self._now_ms()))
                continue
            if head is not None and not results and isinstance(item.state, Parsed):
                result = first_runs[(item.state.message.record_id, item.state.message.payload_hash)] = head
            elif remaining_ms() < self._deadline_margin_ms:
                reason = "not started: the invocation is about to time out"
                results.append(MessageResult(message_id, Outcome.RETRIED, reason, retry_at_ms=self._now_ms()))
                stopped_by = reason
                continue
            else:
                result = self._run_one(item, first_runs, remaining_ms)
            results.append(result)
            if fifo and result.outcome.is_failure:
                stopped_by = f"not started: earlier message {message_id} of group {item.group} failed"
        return results

    def _run_one(
        self,
        item: Prepared,
        first_runs: dict[tuple[str, str], MessageResult],
        remaining_ms: Callable[[], int],
    ) -> MessageResult:
        try:
            if not isinstance(item.state, Parsed):
                return self._processor.execute(item, remaining_ms)
            key = (item.state.message.record_id, item.state.message.payload_hash)
            first = first_runs.get(key)
            if first is None:
                result = self._processor.execute(item, remaining_ms)
                first_runs[key] = result
                return result
            return self._processor.reuse(item, first)
        except Exception as error:  # never let one message fail the whole batch
            return MessageResult(item.message_id, Outcome.RETRIED, f"{type(error).__name__}: {error}")
