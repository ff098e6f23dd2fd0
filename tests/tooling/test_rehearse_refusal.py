"""The rehearsal's IAM refusals, as it reports them: the action and the table."""

from __future__ import annotations

from typing import Any

from local.rehearse import refusal

ARN = "arn:aws:dynamodb:us-east-1:000000000000:table/"
STATEMENTS: list[dict[str, Any]] = [
    {"Sid": "FenceIdempotencyRecords", "Action": ["dynamodb:UpdateItem"], "Resource": f"{ARN}records-1"},
    {"Sid": "ParkPoisonMessages", "Action": "sqs:SendMessage", "Resource": "arn:aws:sqs:us-east-1:0:dlq"},
]
TABLES = ["records-1", "ledger-1"]


def test_a_refusal_names_the_action_and_the_tables_no_statement_allows_it_on() -> None:
    # The emulator's DynamoDB refusals name the action only.
    line = (
        '{"error": "User: arn:aws:sts::0:assumed-role/r/f is not authorized to perform: dynamodb:UpdateItem because"}'
    )
    assert refusal(line, STATEMENTS, TABLES) == "dynamodb:UpdateItem on table ledger-1"
