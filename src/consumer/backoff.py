"""Back off instead of hammering: set when each retried message comes back.

Without this, a message reported in ``batchItemFailures`` returns only after the
queue's full visibility timeout (6 x the function timeout), whatever the reason.
With it, an unstarted message returns at once, a transient failure after an
exponential delay by receive count, and a message in flight elsewhere after that
same delay or when the other worker's lease ends, whichever comes first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from consumer.envelope import SqsMessage, receive_count
from consumer.outcome import Log, MessageResult

if TYPE_CHECKING:
    from types_boto3_sqs import SQSClient
    from types_boto3_sqs.type_defs import ChangeMessageVisibilityBatchRequestEntryTypeDef

# SQS caps a visibility timeout at 12 hours.
MAX_VISIBILITY_SECONDS = 12 * 3600
_BATCH_LIMIT = 10


def queue_url_from_arn(arn: str) -> str:
    """``arn:aws:sqs:eu-west-1:123456789012:orders`` -> the queue's URL."""
    parts = arn.split(":")
    if len(parts) != 6 or parts[2] != "sqs":
        raise ValueError(f"not an SQS queue ARN: {arn!r}")
    _, partition, _, region, account, name = parts
    domain = "amazonaws.com.cn" if partition == "aws-cn" else "amazonaws.com"
    return f"https://sqs.{region}.{domain}/{account}/{name}"


class VisibilityBackoff:
    def __init__(
        self,
        client: Callable[[], SQSClient],
        *,
        base_seconds: int,
        max_seconds: int,
        logger: Log,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._base = base_seconds
        self._max = min(max_seconds, MAX_VISIBILITY_SECONDS)
        self._logger = logger
        self._clock = clock

    def delay_seconds(self, result: MessageResult, receive_count: int) -> int:
        # The shift is capped: a receive count is untrusted input, and 2**count would never end.
        backoff: int = min(self._max, self._base << min(max(0, receive_count - 1), 32))
        if result.retry_at_ms is None:
            return backoff
        # Never later than the other worker's lease end, but no later than the backoff
        # either: the owner usually finishes in milliseconds, long before its lease ends.
        wait_s: int = max(0, math.ceil((result.retry_at_ms - self._clock() * 1000) / 1000))
        return min(wait_s, backoff)

    def schedule(self, messages: Sequence[SqsMessage], results: Sequence[MessageResult]) -> None:
        """Change the visibility of every failed message; never raises (a miss only costs time)."""
        by_queue: dict[str, list[ChangeMessageVisibilityBatchRequestEntryTypeDef]] = {}
        for message, result in zip(messages, results, strict=True):
            arn, receipt = message.get("eventSourceARN"), message.get("receiptHandle")
            if not result.outcome.is_failure or not isinstance(arn, str) or not isinstance(receipt, str):
                continue
            try:
                url = queue_url_from_arn(arn)
            except ValueError:
                continue
            entries = by_queue.setdefault(url, [])
            entries.append(
                {
                    "Id": str(len(entries)),
                    "ReceiptHandle": receipt,
                    "VisibilityTimeout": self.delay_seconds(result, receive_count(message)),
                }
            )
        for url, entries in by_queue.items():
            for start in range(0, len(entries), _BATCH_LIMIT):
                self._change(url, entries[start : start + _BATCH_LIMIT])

    def _change(self, url: str, entries: list[ChangeMessageVisibilityBatchRequestEntryTypeDef]) -> None:
        try:
            response = self._client().change_message_visibility_batch(QueueUrl=url, Entries=entries)
        except Exception as error:
            self._logger.warning("visibility backoff not applied", extra={"queue": url, "error": str(error)})
            return
        for failed in response.get("Failed", []):
            self._logger.warning("visibility backoff refused", extra={"queue": url, "reason": failed.get("Message")})
