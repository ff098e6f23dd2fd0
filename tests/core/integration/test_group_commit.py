"""Group commit on DynamoDB Local behind the conflict emulation: one refused message leaves the others as they were.

The same batch (new messages beside a duplicate, a key reused and a refused business condition, each on its own
tally) is run by a consumer wired as the function is, grouping off and on: the outcomes, the dead letters and the
tables are the same, and grouped the batch took two transactions (the five together, refused; the new ones again).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import boto3
import pytest

from consumer.app import wire
from consumer.config import Settings
from testkit.servers import LocalServers
from tests.core.handlers import REFUSALS, TALLY_TABLE, handlers_for_tests, refusals, tally_total
from tests.kit import Remaining, drain
from tests.utils import settings_on_local_servers


def _run(settings: Settings) -> tuple[dict[str, Any], list[str], list[int], int]:
    calls: Counter[str] = Counter()
    session = boto3.session.Session()
    session.events.register("before-call.dynamodb", lambda model, **_: calls.update([model.name]))
    consumer = wire(settings, session, handlers=handlers_for_tests(settings, ""))
    before, batch = refusals()
    consumer.process(before, Remaining())
    calls.clear()
    results = consumer.process(batch, Remaining()).results
    dynamodb = session.client("dynamodb")
    totals = [tally_total(dynamodb, settings.table_names[TALLY_TABLE], f"t-{n}") for n in range(1, 6)]
    dead_letters = drain(session.client("sqs"), settings.dead_letter_queue_url)
    letters = sorted(letter.original_message_id for letter in dead_letters)
    return {r.message_id: r.outcome for r in results}, letters, totals, calls["TransactWriteItems"]


@pytest.mark.parametrize("on", [False, True], ids=["alone", "grouped"])
def test_one_refused_message_in_a_group_leaves_the_others_outcomes_unchanged(local_aws: LocalServers, on: bool) -> None:
    # A lane each: every message's apply is ready at the same moment.
    settings = settings_on_local_servers(local_aws, max_workers=5, group_commit=on)
    outcomes, letters, totals, transactions = _run(settings)
    assert outcomes == REFUSALS
    assert letters == ["condition", "key-reused"]
    assert totals == [1250] * 5
    assert transactions == (2 if on else 5)
