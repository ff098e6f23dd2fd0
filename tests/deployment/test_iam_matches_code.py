"""The role grants exactly what the deployed code calls, read from src/consumer.

A new boto3 call or a new kind of business write without its permission fails here,
and so does a permission nothing calls any more. Where an operation lands:

- DynamoDB operations live in the idempotency package and act on the idempotency table;
  TransactWriteItems is authorized per item, by the item kinds its transitions put in it.
  The cold-start check (``sdk.py``) describes every table the function writes.
- The business writes (Put, Update, ...) a handler module constructs act on each table its
  handler declares (``tables``), inside the store's transaction: the processor refuses a
  write to any other, so a new table without its grant fails here.
- SQS operations in ``dead_letter.py`` act on the dead-letter queue, any other on the
  consumer queue; a batch operation needs the single-message action.
- The outbox's items (``outbox.py`` builds them, a Put each) go into the store's transaction
  on the outbox table, which the cold-start check describes as it does the idempotency table.
- The relay (``consumer/relay*``) has a role of its own: it sends to each destination a handler
  declares (``destinations``), by the one action of that destination's type, and to nothing else;
  Lambda reads the outbox's stream for it and sends what it gives up on to its on-failure queue.
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from consumer.outbox import OUTBOX_TABLE
from testkit.template import load_template
from tests.deployment.core_lines import CORE_LINES
from tests.deployment.lookups import (
    CORE_TABLES,
    DESTINATION_SENDS,
    EVENT_SOURCE_POLLING,
    destination_mistakes,
    grants_by_statement,
    policy_statements,
)
from tests.deployment.source_scan import (
    PACKAGE_ROOT,
    TRANSACTION_ITEM_ACTIONS,
    business_write_kinds,
    declared_tables,
    operation_uses,
    transaction_item_kinds,
)

ROLE = "ConsumerFunctionRole"
RELAY_ROLE = "RelayFunctionRole"
IDEMPOTENCY = "consumer/idempotency/"
DEAD_LETTER = "consumer/dead_letter.py"
COLD_START_CHECKS = "consumer/sdk.py"
OUTBOX = "consumer/outbox.py"
RELAY = "consumer/relay"
HANDLERS = "service/handlers/"
LOG_WRITING = {"logs:CreateLogStream", "logs:PutLogEvents"}
LOGGING = {"ConsumerLogGroup": LOG_WRITING}
# What the relay's event source mapping does with its role: read the outbox's stream, and send what it gives up on.
RELAY_EVENT_SOURCE = {
    f"{OUTBOX_TABLE}.StreamArn": {
        "dynamodb:DescribeStream",
        "dynamodb:GetRecords",
        "dynamodb:GetShardIterator",
        "dynamodb:ListStreams",
    },
    "RelayDeadLetterQueue": {"sqs:SendMessage"},
    "RelayLogGroup": LOG_WRITING,
}


def required_grants(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    """IAM actions per stack resource that the code at ``root`` needs."""
    required: dict[str, set[str]] = defaultdict(set)
    handler_tables = declared_tables(HANDLERS, root)
    written = {table for tables in handler_tables.values() for table in tables}
    for use in operation_uses(root):
        if use.module.startswith(RELAY):
            continue  # the relay's role: relay_required_grants
        if use.service == "dynamodb" and use.module == COLD_START_CHECKS:
            for table in {*CORE_TABLES, *written}:
                required[table].add(f"dynamodb:{use.operation}")
        elif use.service == "dynamodb":
            assert use.module.startswith(IDEMPOTENCY), f"{use}: which table does it act on? Map it in this test."
            if use.operation == "TransactWriteItems":
                # writes.py builds the handlers' items, on their own tables (granted below, by handler).
                kinds = transaction_item_kinds(IDEMPOTENCY, root, excluding=f"{IDEMPOTENCY}writes.py")
                required["IdempotencyTable"].update(f"dynamodb:{TRANSACTION_ITEM_ACTIONS[kind]}" for kind in kinds)
            else:
                required["IdempotencyTable"].add(f"dynamodb:{use.operation}")
        elif use.service == "sqs":
            queue = "ConsumerDeadLetterQueue" if use.module == DEAD_LETTER else "ConsumerQueue"
            # SQS authorizes SendMessageBatch, DeleteMessageBatch, ... by the single-message action.
            required[queue].add(f"sqs:{use.operation.removesuffix('Batch')}")
        else:
            raise AssertionError(f"{use}: no resource mapping for {use.service}; add one to this test")
    for module, kinds in business_write_kinds(HANDLERS, root).items():
        assert handler_tables.get(module), f"{module} constructs writes but its handler declares no tables"
        for table in handler_tables[module]:
            required[table].update(f"dynamodb:{TRANSACTION_ITEM_ACTIONS[kind]}" for kind in kinds)
    for kinds in business_write_kinds(OUTBOX, root).values():
        required[OUTBOX_TABLE].update(f"dynamodb:{TRANSACTION_ITEM_ACTIONS[kind]}" for kind in kinds)
    return dict(required)


def _expected_grants(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    expected = {**required_grants(root), **LOGGING}
    expected["ConsumerQueue"] = expected.get("ConsumerQueue", set()) | EVENT_SOURCE_POLLING
    return expected


def relay_required_grants(
    template: dict[str, Any], destinations: tuple[str, ...], root: Path = PACKAGE_ROOT
) -> dict[str, set[str]]:
    """IAM actions per stack resource the relay needs: its event source's, and the send action of each destination's
    type on it. Every call of the relay's code must be one of those sends (a batch one by its single action)."""
    sends = set(DESTINATION_SENDS.values())
    for use in operation_uses(root):
        action = f"{use.service}:{use.operation.removesuffix('Batch')}"
        assert not use.module.startswith(RELAY) or action in sends, f"{use}: not a send; map it in this test"
    required = {resource: set(actions) for resource, actions in RELAY_EVENT_SOURCE.items()}
    for destination in destinations:
        required[destination] = {DESTINATION_SENDS[template["Resources"][destination]["Type"]]}
    return required


def grant_mistakes(template: dict[str, Any], expected: dict[str, set[str]], role: str = ROLE) -> list[str]:
    """Each grant the code needs and the role lacks, and each the role has and no code needs, with the statement
    to change (the one granting on that resource; the role when none does)."""
    statements = grants_by_statement(template, role)
    mistakes = []
    for resource in sorted(expected.keys() | {r for by_resource in statements.values() for r in by_resource}):
        granted = {sid: by_resource[resource] for sid, by_resource in statements.items() if resource in by_resource}
        missing = expected.get(resource, set()).difference(*granted.values())
        if missing:
            where, hint = (" or ".join(granted), "") if granted else (role, " (no statement grants on it: add one)")
            mistakes.append(f"missing grant: {where} needs {', '.join(sorted(missing))} on {resource}{hint}")
        for sid, actions in granted.items():
            if extra := sorted(actions - expected.get(resource, set())):
                mistakes.append(
                    f"extra grant: {sid} allows {', '.join(extra)} on {resource}, which no code calls: remove it"
                )
    return mistakes


def test_role_grants_exactly_what_the_code_calls(started_function: str, transformed_template: dict[str, Any]) -> None:
    # Read from code that cannot start, a grant would be advice about the wrong thing: the start's error comes first.
    mistakes = grant_mistakes(transformed_template, _expected_grants())
    if mistakes:
        pytest.fail("\n".join(mistakes), pytrace=False)


def test_the_relays_role_grants_exactly_its_event_source_and_the_sends_to_the_declared_destinations(
    relay_destinations: tuple[str, ...], transformed_template: dict[str, Any]
) -> None:
    expected = relay_required_grants(transformed_template, relay_destinations)
    if mistakes := grant_mistakes(transformed_template, expected, RELAY_ROLE):
        pytest.fail("\n".join(mistakes), pytrace=False)


def _statement(template: dict[str, Any], sid: str, role: str = ROLE) -> dict[str, Any]:
    (statement,) = [statement for statement in policy_statements(template, role) if statement.get("Sid") == sid]
    return statement


@pytest.fixture
def the_core_alone(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """The core's lines of the template (core-lines.yaml, its role among them) and a copy of the core's code without
    the application: what the self-checks below run on, so that they test this check, never the template or the
    handlers under it."""
    copy = tmp_path / "src"
    shutil.copytree(PACKAGE_ROOT / "consumer", copy / "consumer", ignore=shutil.ignore_patterns("__pycache__"))
    return load_template(CORE_LINES), copy


def test_a_grant_taken_away_or_added_is_named_with_its_statement_and_table(
    the_core_alone: tuple[dict[str, Any], Path],
) -> None:
    template, code = the_core_alone
    assert grant_mistakes(template, _expected_grants(code)) == []
    _statement(template, "FenceIdempotencyRecords")["Action"].remove("dynamodb:DeleteItem")
    _statement(template, "FenceIdempotencyRecords")["Action"].append("dynamodb:Scan")
    assert sorted(grant_mistakes(template, _expected_grants(code))) == [
        "extra grant: FenceIdempotencyRecords allows dynamodb:Scan on IdempotencyTable, which no code calls: remove it",
        "missing grant: FenceIdempotencyRecords needs dynamodb:DeleteItem on IdempotencyTable",
    ]


def test_a_new_call_without_its_permission_is_caught(the_core_alone: tuple[dict[str, Any], Path]) -> None:
    template, code = the_core_alone
    dead_letter = code / "consumer" / "dead_letter.py"
    dead_letter.write_text(
        dead_letter.read_text(encoding="utf-8")
        + "\n\ndef empty_the_dead_letter_queue(sqs, url):\n"
        + "    sqs.purge_queue(QueueUrl=url)\n",
        encoding="utf-8",
    )
    assert grant_mistakes(template, _expected_grants(code)) == [
        "missing grant: ParkPoisonMessages needs sqs:PurgeQueue on ConsumerDeadLetterQueue"
    ]


# Destinations of each kind, as a template declares them: no handler of the core's emits, so these are crafted.
_DESTINATIONS = {
    "ReceiptQueue": "AWS::SQS::Queue",
    "OrdersTopic": "AWS::SNS::Topic",
    "OrdersBus": "AWS::Events::EventBus",
}


def _send(sid: str, action: str, resource: dict[str, Any]) -> dict[str, Any]:
    return {"Sid": sid, "Effect": "Allow", "Action": [action], "Resource": resource}


def test_a_destinations_send_missing_extra_or_of_another_kind_is_named(
    the_core_alone: tuple[dict[str, Any], Path],
) -> None:
    template, code = the_core_alone
    destinations = tuple(_DESTINATIONS)
    template["Resources"].update({name: {"Type": kind} for name, kind in _DESTINATIONS.items()})
    assert destination_mistakes(template, destinations) == []
    (policy,) = template["Resources"][RELAY_ROLE]["Properties"]["Policies"]
    document = policy["PolicyDocument"]
    assert grant_mistakes(template, relay_required_grants(template, ()), RELAY_ROLE) == []
    assert grant_mistakes(template, relay_required_grants(template, destinations, code), RELAY_ROLE) == [
        f"missing grant: {RELAY_ROLE} needs events:PutEvents on OrdersBus (no statement grants on it: add one)",
        f"missing grant: {RELAY_ROLE} needs sns:Publish on OrdersTopic (no statement grants on it: add one)",
        f"missing grant: {RELAY_ROLE} needs sqs:SendMessage on ReceiptQueue (no statement grants on it: add one)",
    ]
    document["Statement"] += [
        _send("SendToReceiptQueue", "sqs:SendMessage", {"Fn::GetAtt": ["ReceiptQueue", "Arn"]}),
        _send("PublishToOrdersTopic", "sns:Publish", {"Ref": "OrdersTopic"}),
        _send("PutEventsOnOrdersBus", "events:PutEvents", {"Fn::GetAtt": ["OrdersBus", "Arn"]}),
    ]
    assert grant_mistakes(template, relay_required_grants(template, destinations, code), RELAY_ROLE) == []
    # A handler that no longer declares the topic leaves its grant behind; a queue granted a topic's action.
    document["Statement"][-3]["Action"] = ["sns:Publish"]
    declared = ("ReceiptQueue", "OrdersBus")
    assert grant_mistakes(template, relay_required_grants(template, declared, code), RELAY_ROLE) == [
        "extra grant: PublishToOrdersTopic allows sns:Publish on OrdersTopic, which no code calls: remove it",
        "missing grant: SendToReceiptQueue needs sqs:SendMessage on ReceiptQueue",
        "extra grant: SendToReceiptQueue allows sns:Publish on ReceiptQueue, which no code calls: remove it",
    ]


# A relay module calling each kind of destination, written for the check: what it reads of a relay is its calls.
_RELAY_SENDS = """import boto3

def send(url, arn, bus, body):
    boto3.client("sqs").send_message(QueueUrl=url, MessageBody=body)
    boto3.client("sns").publish(TopicArn=arn, Message=body)
    boto3.client("events").put_events(Entries=[{"EventBusName": bus, "Detail": body}])
"""


def test_the_relays_calls_are_its_own_roles_and_each_is_a_send(the_core_alone: tuple[dict[str, Any], Path]) -> None:
    template, code = the_core_alone
    relay = code / "consumer" / "relay.py"
    relay.write_text(_RELAY_SENDS, encoding="utf-8")
    # The consumer's role is unchanged by them (the relay's SendMessage is not on the consumer queue)...
    assert grant_mistakes(template, _expected_grants(code)) == []
    assert relay_required_grants(template, (), code) == RELAY_EVENT_SOURCE
    # ...and a call of the relay's that is not a send is asked to be mapped, never granted unseen.
    relay.write_text(relay.read_text(encoding="utf-8") + '\nboto3.client("sqs").purge_queue(QueueUrl="q")\n')
    with pytest.raises(AssertionError, match=r"PurgeQueue.*not a send; map it in this test"):
        relay_required_grants(template, (), code)
