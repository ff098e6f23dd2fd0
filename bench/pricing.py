"""What a million messages cost: Lambda, DynamoDB on-demand and SQS, at list prices.

Prices are us-east-1 list prices, not fetched by the run: update ``PRICES_AS_OF`` with them.
Lambda bills each invocation's duration rounded up to the millisecond, times the memory
size in GB, at the arm64 rate (first tier), plus a per-request fee. DynamoDB bills
request units; SQS bills every API request (up to 10 messages and 64 KB each).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.costs import Cost

REGION = "us-east-1"
PRICES_AS_OF = "2025-01-15 (AWS pricing pages; DynamoDB on-demand after the 2024-11-01 price cut)"
LAMBDA_ARM64_PER_GB_S = 0.0000133334
LAMBDA_PER_REQUEST = 0.20 / 1e6
DYNAMODB_PER_WRITE_UNIT = 0.625 / 1e6
DYNAMODB_PER_READ_UNIT = 0.125 / 1e6
SQS_PER_REQUEST = 0.40 / 1e6
MILLION = 1_000_000


@dataclass(frozen=True)
class SqsRequests:
    """SQS requests per message, happy path, for a batch of ``batch_size`` through the event source mapping."""

    batch_size: int

    @property
    def sends(self) -> float:
        return 1.0  # the producer's SendMessage: the same for every system

    @property
    def receives(self) -> float:
        return 1 / self.batch_size

    @property
    def deletes(self) -> float:
        return 1 / self.batch_size  # the mapping deletes a batch's successes in one DeleteMessageBatch

    # New payments on distinct accounts: none fails, none goes to the DLQ, no visibility change.
    visibility_changes: float = 0.0
    dead_letter_sends: float = 0.0

    @property
    def total(self) -> float:
        return self.sends + self.receives + self.deletes + self.visibility_changes + self.dead_letter_sends


@dataclass(frozen=True)
class CostPerMillion:
    lambda_usd: float
    dynamodb_usd: float
    sqs_usd: float

    @property
    def total_usd(self) -> float:
        return self.lambda_usd + self.dynamodb_usd + self.sqs_usd


def cost_per_million(batch_wall_s: float, batch_size: int, memory_mb: int, units: Cost) -> CostPerMillion:
    """A million messages in batches of ``batch_size`` taking ``batch_wall_s`` each, ``units`` per message."""
    billed_s = math.ceil(batch_wall_s * 1000) / 1000
    per_batch = billed_s * memory_mb / 1024 * LAMBDA_ARM64_PER_GB_S + LAMBDA_PER_REQUEST
    return CostPerMillion(
        lambda_usd=per_batch / batch_size * MILLION,
        dynamodb_usd=(units.write_units * DYNAMODB_PER_WRITE_UNIT + units.read_units * DYNAMODB_PER_READ_UNIT)
        * MILLION,
        sqs_usd=SqsRequests(batch_size).total * SQS_PER_REQUEST * MILLION,
    )


def price_table() -> list[tuple[str, str]]:
    return [
        ("Lambda, arm64, per GB-second (first 6 billion GB-s a month)", f"${LAMBDA_ARM64_PER_GB_S:.10f}"),
        ("Lambda, per million requests", f"${LAMBDA_PER_REQUEST * MILLION:.2f}"),
        ("DynamoDB on-demand, per million write request units", f"${DYNAMODB_PER_WRITE_UNIT * MILLION:.3f}"),
        ("DynamoDB on-demand, per million read request units", f"${DYNAMODB_PER_READ_UNIT * MILLION:.3f}"),
        ("SQS standard queue, per million requests (after the free million)", f"${SQS_PER_REQUEST * MILLION:.2f}"),
    ]
