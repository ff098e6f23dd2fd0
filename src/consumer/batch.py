"""A batch from Lambda's SQS event source: lanes in parallel, records in a lane in order.

A lane is what must stay ordered. On a standard queue that is one idempotency key:
records with the same key run one after another, so a duplicate inside the batch
reuses the first one's outcome without touching DynamoDB. On a FIFO queue it is one
``MessageGroupId``: its records run in order and the first failure stops the group,
with every later record of the group reported too, as SQS FIFO ordering requires.

Near the invocation's deadline no new record is started; unstarted records are
reported as failures, so SQS delivers them again.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from consumer.backoff import VisibilityBackoff
from consumer.envelope import message_group_id
from consumer.processor import Outcome, Prepared, RecordProcessor, RecordResult, Rejected


@dataclass(frozen=True)
class BatchResult:
    results: tuple[RecordResult, ...]

    def failures(self) -> list[str]:
        return [result.message_id for result in self.results if result.outcome.is_failure]

    def response(self) -> dict[str, list[dict[str, str]]]:
        """The partial batch response Lambda expects with ``ReportBatchItemFailures``."""
        return {"batchItemFailures": [{"itemIdentifier": message_id} for message_id in self.failures()]}

    def counts(self) -> Counter[Outcome]:
        return Counter(result.outcome for result in self.results)


def _validate(records: Any) -> list[dict[str, Any]]:
    if not isinstance(records, list):
        raise ValueError("event has no 'Records' list: this function takes SQS events only")
    seen: set[str] = set()
    for index, record in enumerate(records):
        if not isinstance(record, dict) or not isinstance(record.get("messageId"), str):
            raise ValueError(f"record {index} has no messageId: not an SQS record")
        if record["messageId"] in seen:
            raise ValueError(f"messageId {record['messageId']} appears twice in one batch")
        seen.add(record["messageId"])
    return records


def _now_ms() -> int:
    return int(time.time() * 1000)


def _is_fifo(records: Iterable[dict[str, Any]]) -> bool:
    return any(message_group_id(record) for record in records)


class BatchProcessor:
    def __init__(
        self,
        processor: RecordProcessor,
        *,
        max_workers: int,
        deadline_margin_ms: int,
        backoff: VisibilityBackoff | None = None,
    ) -> None:
        self._processor = processor
        self._backoff = backoff
        self._max_workers = max_workers
        self._deadline_margin_ms = deadline_margin_ms
        # One pool per container: threads are reused across warm invocations.
        self._pool: ThreadPoolExecutor | None = None

    def process(self, records: Any, remaining_ms: Callable[[], int]) -> BatchResult:
        records = _validate(records)
        fifo = _is_fifo(records)
        items = [self._processor.prepare(record) for record in records]
        lanes: dict[str, list[int]] = {}
        for index, item in enumerate(items):
            lanes.setdefault(self._lane_key(item, fifo), []).append(index)

        results: list[RecordResult | None] = [None] * len(records)

        def run(indexes: list[int]) -> None:
            for index, result in zip(
                indexes, self._run_lane([items[i] for i in indexes], fifo, remaining_ms), strict=True
            ):
                results[index] = result

        if len(lanes) == 1 or self._max_workers == 1:
            for indexes in lanes.values():
                run(indexes)
        else:
            pool = self._executor()
            for future in [pool.submit(run, indexes) for indexes in lanes.values()]:
                future.result()
        done = tuple(result for result in results if result is not None)
        assert len(done) == len(records), "every record ends with exactly one result"
        if self._backoff is not None:
            self._backoff.schedule(records, done)
        return BatchResult(done)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="record")
        return self._pool

    @staticmethod
    def _lane_key(item: Prepared | Rejected, fifo: bool) -> str:
        if fifo:
            return "group:" + (message_group_id(item.record) or "")
        if isinstance(item, Prepared):
            return "key:" + item.message.record_id
        return "message:" + item.record["messageId"]

    def _run_lane(
        self, items: list[Prepared | Rejected], fifo: bool, remaining_ms: Callable[[], int]
    ) -> list[RecordResult]:
        results: list[RecordResult] = []
        # (record id, payload hash) -> the outcome of its first execution in this batch.
        first_runs: dict[tuple[str, str], RecordResult] = {}
        stopped_by: str | None = None
        for item in items:
            message_id = item.record["messageId"]
            if stopped_by is not None:
                results.append(RecordResult(message_id, Outcome.RETRIED, stopped_by, retry_at_ms=_now_ms()))
                continue
            if remaining_ms() < self._deadline_margin_ms:
                reason = "not started: the invocation is about to time out"
                results.append(RecordResult(message_id, Outcome.RETRIED, reason, retry_at_ms=_now_ms()))
                stopped_by = reason
                continue
            result = self._run_one(item, first_runs, remaining_ms)
            results.append(result)
            if fifo and result.outcome.is_failure:
                group = message_group_id(item.record)
                stopped_by = f"not started: earlier message {message_id} of group {group} failed"
        return results

    def _run_one(
        self,
        item: Prepared | Rejected,
        first_runs: dict[tuple[str, str], RecordResult],
        remaining_ms: Callable[[], int],
    ) -> RecordResult:
        message_id = item.record["messageId"]
        try:
            if isinstance(item, Rejected):
                return self._processor.execute(item, remaining_ms)
            key = (item.message.record_id, item.message.payload_hash)
            first = first_runs.get(key)
            if first is None:
                result = self._processor.execute(item, remaining_ms)
                first_runs[key] = result
                return result
            return self._processor.reuse(item, first)
        except Exception as error:  # never let one record fail the whole batch
            return RecordResult(message_id, Outcome.RETRIED, f"{type(error).__name__}: {error}")
