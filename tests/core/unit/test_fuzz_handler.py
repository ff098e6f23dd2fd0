"""The whole handler, fuzzed: no message can fail its batch, and valid ones are applied once.

Batches of 1 to 10 records mix valid messages of the test handlers (tests/core/handlers.py: tally
entries and webhook calls) with arbitrary bodies (any JSON, deep, wide, huge strings, non-JSON
text, unicode edge cases), arbitrary message attributes and record fields, and the family of
messages at SQS's limits (``tests.core.hostile``). ``make proof`` runs a bounded number of examples;
``make fuzz`` runs the ``fuzz`` profile (about 20 minutes). Every failing example
found is pinned as a regular test in ``test_hostile_input.py``.

Events that are not SQS events at all must still fail the invocation loudly: the
split is checked too.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto import mock_aws

from consumer import app
from consumer.config import Settings, table_variable
from consumer.envelope import MAX_BODY_BYTES, parse_message
from consumer.errors import ErrorType, PoisonMessage
from consumer.handler import MessageHandler
from testkit.lambda_sqs import REGION, LambdaContext, sqs_record
from testkit.webhook import WebhookSink
from tests.core.handlers import (
    CALL_EVENT,
    TALLY_EVENT,
    UNIT,
    CallHandler,
    TallyHandler,
    call_payload,
    create_test_tables,
    handlers_for_tests,
    tally_payload,
)
from tests.core.hostile import hostile_family
from tests.core.unit.conftest import total
from tests.kit import drain, reasons
from tests.utils import settings_for_tests

settings.register_profile(
    "bounded", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "7000")),
    derandomize=False,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = os.environ.get("FUZZ_PROFILE", "bounded")

_ids = itertools.count()


def _unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_ids)}"


# -- what a batch holds -----------------------------------------------------------------------------

# Only what SQS can carry: it refuses other characters before they reach the function.
sqs_chars = st.characters(
    codec="utf-8", exclude_categories=["Cs"], exclude_characters="\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0c\x0e"
)
sqs_text = st.text(sqs_chars, max_size=60)
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    sqs_text,
)
any_json = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.dictionaries(sqs_text, inner, max_size=6)),
    max_leaves=30,
)


def _deep(depth: int, opener: str) -> str:
    closer = {"[": "]", '{"a":': "}"}[opener]
    core = "[]" if opener == "[" else "1"
    return '{"eventType":"' + TALLY_EVENT + '","payload":' + opener * depth + core + closer * depth + "}"


hostile_body = st.one_of(
    any_json.map(lambda value: json.dumps(value, allow_nan=True)),
    sqs_text,
    st.builds(_deep, st.integers(0, 6_000), st.sampled_from(["[", '{"a":'])),
    st.integers(MAX_BODY_BYTES - 64, MAX_BODY_BYTES + 64).map(lambda size: '{"x":"' + "y" * (size - 8) + '"}'),
    st.fixed_dictionaries(
        {
            "eventType": st.one_of(st.sampled_from([TALLY_EVENT, CALL_EVENT, "Nope", ""]), any_json),
            "metadata": st.one_of(st.fixed_dictionaries({"idempotencyKey": st.one_of(sqs_text, any_json)}), any_json),
            "payload": any_json,
        }
    ).map(lambda envelope: json.dumps(envelope, allow_nan=True)),
)

hostile_fields = st.fixed_dictionaries(
    {},
    optional={
        "attributes": st.one_of(
            any_json, st.fixed_dictionaries({"ApproximateReceiveCount": st.one_of(sqs_text, any_json)})
        ),
        "messageAttributes": st.one_of(
            any_json,
            st.dictionaries(
                sqs_text,
                st.one_of(
                    any_json,
                    st.fixed_dictionaries(
                        {
                            "dataType": st.sampled_from(["String", "Number", "Binary", "String.x"]),
                            "stringValue": sqs_text,
                        }
                    ),
                ),
                max_size=12,
            ),
        ),
        "eventSourceARN": any_json,
        "receiptHandle": any_json,
        "md5OfBody": any_json,
    },
)


# Keys the envelope accepts but an HTTP header cannot carry as they are (the test handler's webhook call).
key_prefixes = st.sampled_from(["fz-key", "заказ-", "🧾", "line\r\nInjected: yes", "tab\tand space%"])


def valid_entry(key_prefix: str = "fz-key") -> dict[str, Any]:
    body = {
        "eventType": TALLY_EVENT,
        "metadata": {"idempotencyKey": _unique(key_prefix)},
        "payload": tally_payload(_unique("fz-entry"), _unique("fz-tally"), 777, UNIT),
    }
    return sqs_record(_unique("valid"), json.dumps(body))


def valid_call(key_prefix: str = "fz-call") -> dict[str, Any]:
    body = {
        "eventType": CALL_EVENT,
        "metadata": {"idempotencyKey": _unique(key_prefix)},
        "payload": call_payload(_unique("c")),
    }
    return sqs_record(_unique("valid"), json.dumps(body))


# Drawn on purpose, not left to chance: no strategy above reaches a megabyte of fields or thousands of attributes.
AT_SQS_LIMITS = hostile_family(TALLY_EVENT, tally_payload("fz-entry", "fz-tally", 777, UNIT))


@st.composite
def hostile_record(draw: st.DrawFn) -> dict[str, Any]:
    # One hostile record in ten is a member of the family: each costs a megabyte, the rest are small.
    if draw(st.integers(0, 9)) == 0:
        at_limit = draw(st.sampled_from(AT_SQS_LIMITS))
        return sqs_record(_unique("hostile"), at_limit.body, message_attributes=at_limit.message_attributes)
    record = sqs_record(_unique("hostile"), draw(hostile_body))
    record.update(draw(hostile_fields))
    return record


@st.composite
def batches(draw: st.DrawFn) -> list[dict[str, Any]]:
    size = draw(st.integers(1, 10))
    kinds = draw(st.lists(st.sampled_from(["entry", "call", "hostile", "hostile"]), min_size=size, max_size=size))
    makers = {"entry": valid_entry, "call": valid_call}
    return [makers[kind](draw(key_prefixes)) if kind in makers else draw(hostile_record()) for kind in kinds]


def registry(webhook_url: str) -> tuple[type[MessageHandler[Any]], ...]:
    """The test handlers as the registry holds them (built from settings alone), calls going to ``webhook_url``."""

    class Calls(CallHandler):
        def __init__(self, settings: Settings) -> None:
            super().__init__(settings, webhook_url)

    return (TallyHandler, Calls)


# -- the oracle ---------------------------------------------------------------------------------------


def is_valid(record: dict[str, Any]) -> bool:
    """Whether the record passes the contract and its handler's schema (what may be applied)."""
    handlers = handlers_for_tests(settings_for_tests())
    try:
        message = parse_message(record)
    except PoisonMessage:
        return False
    handler = handlers.get(message.event_type)
    if handler is None:
        return False
    try:
        handler.payload_model.model_validate(message.payload)
    except ValueError:
        return False
    return True


class Function:
    """The deployed handler's view, the test handlers registered: its environment on moto, and what
    reached the DLQ."""

    def __init__(self, webhook: WebhookSink) -> None:
        self.dynamodb = boto3.client("dynamodb", region_name=REGION)
        self.sqs = boto3.client("sqs", region_name=REGION)
        self.registry = registry(f"{webhook.url}/calls")
        self.handler = app.lambda_handler(())  # given the registry once the environment is set
        every = settings_for_tests().every_table()
        self.tables = {
            table: every[table] for table in ("IdempotencyTable", TallyHandler.tables[0], CallHandler.tables[0])
        }
        create_test_tables(self.dynamodb, self.tables)
        self.dlq_url = self.sqs.create_queue(QueueName="fuzz-dlq")["QueueUrl"]
        self.env = {
            **{table_variable(table): name for table, name in self.tables.items()},
            "DEAD_LETTER_QUEUE_URL": self.dlq_url,
            "MAX_WORKERS": "1",  # moto in process is not thread-safe
        }

    def empty_tables(self) -> None:
        """Fresh tables for each batch: moto copies every table on every transaction, so a
        table that kept growing would make each batch slower and heavier than the last."""
        for table in self.tables.values():
            self.dynamodb.delete_table(TableName=table)
        create_test_tables(self.dynamodb, self.tables)

    def dead_letters(self) -> dict[str, str | None]:
        return reasons(drain(self.sqs, self.dlq_url))


@pytest.fixture(scope="module")
def function() -> Iterator[Function]:
    with pytest.MonkeyPatch.context() as patch, WebhookSink() as webhook:
        for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_SQS", "AWS_PROFILE"):
            patch.delenv(name, raising=False)
        for name, value in {
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        }.items():
            patch.setenv(name, value)
        with mock_aws():
            fn = Function(webhook)
            for name, value in fn.env.items():
                patch.setenv(name, value)
            fn.handler = app.lambda_handler(fn.registry)
            yield fn


@pytest.mark.long(40)
@settings(settings.get_profile(PROFILE))
@given(records=batches())
def test_every_record_of_any_batch_ends_in_exactly_one_place(function: Function, records: list[dict[str, Any]]) -> None:
    function.empty_tables()
    ids = [record["messageId"] for record in records]

    response = function.handler({"Records": records}, LambdaContext())

    assert set(response) == {"batchItemFailures"}
    reported = [failure["itemIdentifier"] for failure in response["batchItemFailures"]]
    assert set(reported) <= set(ids)
    dead = function.dead_letters()
    assert set(dead) <= set(ids)
    assert not set(dead) & set(reported), "a record both dead-lettered and retried would reach the DLQ twice"
    assert set(dead.values()) <= {error_type.value for error_type in ErrorType}
    for record in records:
        message_id = record["messageId"]
        if message_id in reported or message_id in dead:
            continue
        # Neither retried nor dead-lettered: it must have been applied (or a duplicate), so valid.
        assert is_valid(record), f"{message_id} vanished: not reported, not dead-lettered, not valid"
    for record in records:
        if record["messageId"].startswith("valid"):
            # Nothing injects faults here: every valid message is applied at once, and exactly once.
            assert record["messageId"] not in reported and record["messageId"] not in dead
            payload = json.loads(record["body"])["payload"]
            if json.loads(record["body"])["eventType"] == TALLY_EVENT:
                assert total(function.dynamodb, payload["tallyId"]) == 777


not_sqs_events = st.one_of(
    any_json.filter(lambda value: not isinstance(value, dict) or not isinstance(value.get("Records"), list)),
    st.lists(st.one_of(any_json, st.fixed_dictionaries({"body": sqs_text})), min_size=1, max_size=3)
    .filter(lambda records: any(not isinstance(r, dict) or not isinstance(r.get("messageId"), str) for r in records))
    .map(lambda records: {"Records": records}),
)


@settings(settings.get_profile(PROFILE), max_examples=min(settings.get_profile(PROFILE).max_examples, 200))
@given(event=not_sqs_events)
def test_an_event_that_is_not_an_sqs_event_fails_the_invocation_loudly(function: Function, event: Any) -> None:
    with pytest.raises(ValueError, match="SQS"):
        function.handler(event, LambdaContext())
