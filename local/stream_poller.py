"""A poller that behaves as Lambda's DynamoDB stream event source mapping (the outbox's relay is fed by one).

Per shard, in order, from the stream's oldest record (``TRIM_HORIZON``), a shard after its parent: read up to BatchSize
records after the shard's checkpoint, invoke the function with the event Lambda builds, and move the checkpoint as
Lambda does. A partial batch response (``batchItemFailures``) checkpoints the records before the first one named, and
the next batch starts at it. An error, a timeout or an invalid response checkpoints nothing; with
``BisectBatchOnFunctionError`` the next attempt takes half the batch. A batch retried more than
``MaximumRetryAttempts`` times is given up: a record of it (the shard and the batch's first and last sequence numbers,
as Lambda writes it) goes to the on-failure queue, and the checkpoint passes it. ``MaximumRecordAgeInSeconds`` is not
applied: a local stream is minutes old.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from testkit.invocation import Invocation, Invoker
from testkit.resources import StreamTrigger

logger = logging.getLogger(__name__)


def parents_first(shards: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The shards, each after its parent: a stream's records are in order within a shard and its children (DynamoDB
    Local rolls a shard over every 4 hours)."""
    read: set[str] = set()
    ids = {shard["ShardId"] for shard in shards}
    waiting = list(shards)
    while waiting:
        ready = [s for s in waiting if s.get("ParentShardId") not in ids or s["ParentShardId"] in read]
        for shard in ready:
            read.add(shard["ShardId"])
            waiting.remove(shard)
            yield shard


def lambda_record(record: dict[str, Any], stream_arn: str) -> dict[str, Any]:
    """A record of GetRecords as Lambda hands it to the function: with its stream's ARN, times as epoch seconds."""
    change = dict(record["dynamodb"])
    created = change.get("ApproximateCreationDateTime")
    if isinstance(created, datetime.datetime):
        change["ApproximateCreationDateTime"] = created.timestamp()
    return {**record, "dynamodb": change, "eventSourceARN": stream_arn}


@dataclass
class _Shard:
    shard_id: str
    closed: bool
    # The last record handed on for good (sent, or given up): the next batch starts after it.
    checkpoint: str | None = None
    # Attempts of the batch starting after the checkpoint, and the size bisection has cut it to.
    attempts: int = 0
    limit: int | None = None
    done: bool = False


@dataclass
class StreamPollerStats:
    invocations: int = 0
    records: int = 0
    checkpointed: int = 0
    given_up: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)


@dataclass(eq=False)
class StreamPoller:
    """One stream's mapping, one invocation at a time (Lambda's ParallelizationFactor of 1)."""

    streams: Any
    sqs: Any
    trigger: StreamTrigger
    runtime: Invoker
    on_batch: Callable[[Invocation], None] | None = None
    # How long a poll that found nothing waits before the next (Lambda reads each shard four times a second).
    idle_s: float = 0.25
    stats: StreamPollerStats = field(default_factory=StreamPollerStats)
    _shards: dict[str, _Shard] = field(default_factory=dict)

    def _refresh(self) -> list[_Shard]:
        """The stream's shards, parents first; a closed shard read to its end is done."""
        described = self.streams.describe_stream(StreamArn=self.trigger.stream_arn)["StreamDescription"]["Shards"]
        for shard in parents_first(described):
            closed = "EndingSequenceNumber" in shard.get("SequenceNumberRange", {})
            known = self._shards.setdefault(shard["ShardId"], _Shard(shard["ShardId"], closed))
            known.closed = closed
        return [shard for shard in self._shards.values() if not shard.done]

    def _read(self, shard: _Shard, limit: int) -> list[dict[str, Any]]:
        position = (
            {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": shard.checkpoint}
            if shard.checkpoint
            else {"ShardIteratorType": "TRIM_HORIZON"}
        )
        iterator = self.streams.get_shard_iterator(
            StreamArn=self.trigger.stream_arn, ShardId=shard.shard_id, **position
        )["ShardIterator"]
        page = self.streams.get_records(ShardIterator=iterator, Limit=limit)
        if not page["Records"] and shard.closed:
            shard.done = True
        return list(page["Records"])

    def poll_once(self) -> Invocation | None:
        """One batch of the first shard with records after its checkpoint; ``None`` (after ``idle_s``) when every
        shard is read."""
        for shard in self._refresh():
            records = self._read(shard, shard.limit or self.trigger.batch_size)
            if records:
                return self._invoke(shard, records)
            if not shard.done:
                # A shard's children wait for it: nothing after an open shard that has nothing yet.
                break
        time.sleep(self.idle_s)
        return None

    def drain(self) -> int:
        """Poll until every record so far is checkpointed or given up; how many invocations it took."""
        invocations = 0
        while self.poll_once() is not None:
            invocations += 1
        return invocations

    def _invoke(self, shard: _Shard, records: list[dict[str, Any]]) -> Invocation:
        event = {"Records": [lambda_record(record, self.trigger.stream_arn) for record in records]}
        invocation = self.runtime.invoke(event)
        verdict = self._settle(shard, records, invocation)
        self.stats.invocations += 1
        self.stats.records += len(records)
        self.stats.verdicts[verdict] = self.stats.verdicts.get(verdict, 0) + 1
        if self.on_batch is not None:
            self.on_batch(invocation)
        return invocation

    def _settle(self, shard: _Shard, records: list[dict[str, Any]], invocation: Invocation) -> str:
        sequences = [record["dynamodb"]["SequenceNumber"] for record in records]
        failed_at, verdict = self._failed_at(invocation, sequences)
        if failed_at is None:
            self._checkpoint(shard, sequences[-1], len(records))
            return verdict
        # What came before the first failure is done; the batch is retried from it.
        if failed_at > 0:
            self._checkpoint(shard, sequences[failed_at - 1], failed_at)
            shard.attempts = 1
            return verdict
        shard.attempts += 1
        if verdict != "partial" and self.trigger.bisect_on_error and len(records) > 1:
            shard.limit = (len(records) + 1) // 2
        if shard.attempts > self.trigger.maximum_retry_attempts:
            self._give_up(shard, records, verdict)
        return verdict

    def _failed_at(self, invocation: Invocation, sequences: list[str]) -> tuple[int | None, str]:
        """The index the batch must be retried from (``None``: it all went), and the verdict's name."""
        if invocation.error is not None:
            return 0, "raised"
        if invocation.timed_out:
            return 0, "timed_out"
        failures = (invocation.response or {}).get("batchItemFailures") if self.trigger.report_failures else None
        if not failures:
            return None, "partial"
        named = [failure.get("itemIdentifier") if isinstance(failure, dict) else None for failure in failures]
        # As Lambda: an identifier that is not a sequence number of the batch (or empty) fails the whole batch.
        if any(identifier not in sequences for identifier in named):
            return 0, "invalid_response"
        return min(sequences.index(str(identifier)) for identifier in named), "partial"

    def _checkpoint(self, shard: _Shard, sequence: str, count: int) -> None:
        shard.checkpoint, shard.attempts, shard.limit = sequence, 0, None
        self.stats.checkpointed += count

    def _give_up(self, shard: _Shard, records: list[dict[str, Any]], verdict: str) -> None:
        """The batch to the on-failure queue (what Lambda sends: where the records are, not the records), then on."""
        first, last = records[0]["dynamodb"]["SequenceNumber"], records[-1]["dynamodb"]["SequenceNumber"]
        if self.trigger.on_failure_url:
            document = {
                "requestContext": {"condition": "RetryAttemptsExhausted", "approximateInvokeCount": shard.attempts},
                "responseContext": {"functionError": verdict},
                "DDBStreamBatchInfo": {
                    "shardId": shard.shard_id,
                    "startSequenceNumber": first,
                    "endSequenceNumber": last,
                    "batchSize": len(records),
                    "streamArn": self.trigger.stream_arn,
                },
            }
            self.sqs.send_message(QueueUrl=self.trigger.on_failure_url, MessageBody=json.dumps(document))
        logger.warning("stream batch given up after %d attempts: %s..%s", shard.attempts, first, last)
        self.stats.given_up += len(records)
        self._checkpoint(shard, last, 0)
