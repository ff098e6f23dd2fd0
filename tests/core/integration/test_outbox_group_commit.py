"""The outbox in group commit, on DynamoDB Local behind the conflict emulation: a message's outgoing messages share
its transition's transaction, grouped or alone, so a batch emits the same messages either way, and a refused message
in a group emits nothing while the others' messages are written."""

from __future__ import annotations

from collections import Counter
from typing import Any

import boto3
import pytest

from consumer.app import wire
from consumer.handler import MessageHandler
from consumer.outbox import OUTBOX_TABLE
from consumer.outcome import Outcome
from testkit.lambda_sqs import sqs_record
from testkit.servers import LocalServers
from tests.core.handlers import NOTICE_EVENT, NoticeHandler, notice_body
from tests.kit import Remaining, drain
from tests.utils import settings_on_local_servers


def _run(
    local_aws: LocalServers, on: bool, batch: list[dict[str, Any]]
) -> tuple[list[Outcome], list[str], set[str], int]:
    """The batch after a first notice ``n-0`` was applied: outcomes, dead-lettered ids, outbox ids, transactions."""
    settings = settings_on_local_servers(local_aws, max_workers=10, group_commit=on)
    calls: Counter[str] = Counter()
    session = boto3.session.Session()
    session.events.register("before-call.dynamodb", lambda model, **_: calls.update([model.name]))
    handlers: dict[str, MessageHandler[Any]] = {NOTICE_EVENT: NoticeHandler(settings)}
    consumer = wire(settings, session, handlers=handlers)
    consumer.process([sqs_record("first", notice_body("n-0", 1))], Remaining())
    calls.clear()
    results = consumer.process(batch, Remaining()).results
    dynamodb = session.client("dynamodb")
    pages = dynamodb.get_paginator("scan").paginate(TableName=settings.table_names[OUTBOX_TABLE], ConsistentRead=True)
    keys = {item["id"]["S"] for page in pages for item in page["Items"]}
    letters = sorted(
        letter.original_message_id for letter in drain(session.client("sqs"), settings.dead_letter_queue_url)
    )
    return [result.outcome for result in results], letters, keys, calls["TransactWriteItems"]


def _keys(notice: str, count: int) -> set[str]:
    return {f"{NOTICE_EVENT}#notice-{notice}#{position}" for position in range(count)}


@pytest.mark.parametrize("on", [False, True], ids=["alone", "grouped"])
def test_a_refused_message_in_a_group_emits_nothing_and_the_others_emit_theirs(
    local_aws: LocalServers, on: bool
) -> None:
    batch = [sqs_record(f"m-{n}", notice_body(f"n-{n}", 2)) for n in range(1, 5)]
    # n-0 again under another key: its entry's condition refuses it, with its three messages.
    batch.insert(2, sqs_record("refused", notice_body("n-0", 3, key="another-key")))

    outcomes, letters, keys, transactions = _run(local_aws, on, batch)

    assert outcomes == [Outcome.APPLIED, Outcome.APPLIED, Outcome.POISON, Outcome.APPLIED, Outcome.APPLIED]
    assert letters == ["refused"]
    assert keys == _keys("n-0", 1) | set().union(*(_keys(f"n-{n}", 2) for n in range(1, 5)))
    # Grouped: the five together (refused whole), then the four again; alone, one each.
    assert transactions == (2 if on else 5)


@pytest.mark.parametrize("on", [False, True], ids=["alone", "grouped"])
def test_outgoing_messages_count_against_a_shared_transactions_hundred_items(local_aws: LocalServers, on: bool) -> None:
    # 42 items each (record, entry, 40 messages): two fit in one transaction of 100, the third does not.
    batch = [sqs_record(f"m-{n}", notice_body(f"n-{n}", 40)) for n in range(1, 4)]

    outcomes, letters, keys, transactions = _run(local_aws, on, batch)

    assert outcomes == [Outcome.APPLIED] * 3
    assert letters == []
    assert keys == _keys("n-0", 1) | set().union(*(_keys(f"n-{n}", 40) for n in range(1, 4)))
    assert transactions == (2 if on else 3)
