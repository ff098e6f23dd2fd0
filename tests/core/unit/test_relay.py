"""The relay on moto in process: each outbox item the consumer writes goes to its queue, topic or bus, in order, and a
batch stops at the first record that cannot be sent.

The stream records are built from what ``outbox_writes`` puts (each ``Put``'s typed item is the record's ``NewImage``),
so the relay reads exactly what the consumer writes.
"""

from __future__ import annotations

import json
from typing import Any

import boto3
import botocore.session
import pytest

from consumer import app
from consumer.config import destination_variable
from consumer.errors import ConfigurationError
from consumer.outbox import Attr, BusEvent, Outgoing, QueueMessage, TopicMessage, derived_key, outbox_writes
from consumer.relay import RelayHandler
from testkit.lambda_sqs import REGION, LambdaContext
from testkit.processes import free_port
from tests.core.unit.conftest import fresh_interpreter, run
from tests.kit import Clock, drain

RECORD_ID = "PaymentReceived#p-1"
CREATED_AT_MS = 1_800_000_000_000


def images(*messages: Outgoing, record_id: str = RECORD_ID, now_ms: int = CREATED_AT_MS) -> list[dict[str, Any]]:
    """The outbox items the consumer writes for ``messages``, as DynamoDB's typed values (a stream's ``NewImage``)."""
    puts = outbox_writes(
        messages,
        table="outbox",
        destinations=[message.destination for message in messages],
        record_id=record_id,
        now_ms=now_ms,
        ttl_seconds=3600,
    )
    return [put.to_transact_item()["Put"]["Item"] for put in puts]


def stream_record(image: dict[str, Any], sequence: str, event_name: str = "INSERT") -> dict[str, Any]:
    """A DynamoDB stream record of the outbox table (view NEW_IMAGE), as Lambda hands it over."""
    change: dict[str, Any] = {
        "Keys": {Attr.ID.value: image[Attr.ID]},
        "SequenceNumber": sequence,
        "SizeBytes": 200,
        "StreamViewType": "NEW_IMAGE",
    }
    if event_name != "REMOVE":  # a removed item has no new image
        change["NewImage"] = image
    return {
        "eventID": f"event-{sequence}",
        "eventName": event_name,
        "eventSource": "aws:dynamodb",
        "awsRegion": REGION,
        "dynamodb": change,
    }


def event(*images_: dict[str, Any], first_sequence: int = 100) -> dict[str, Any]:
    return {"Records": [stream_record(image, str(first_sequence + n)) for n, image in enumerate(images_)]}


def queue(sqs: Any, name: str, **attributes: str) -> tuple[str, str]:
    """A queue on moto: its URL and ARN."""
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return url, arn


def fifo_ids(sqs: Any, url: str) -> list[tuple[str, str, str]]:
    """Each message of a FIFO queue, in order: its body, group id and deduplication id."""
    answer = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["MessageGroupId", "MessageDeduplicationId"]
    )
    return [
        (m["Body"], m["Attributes"]["MessageGroupId"], m["Attributes"]["MessageDeduplicationId"])
        for m in answer.get("Messages", [])
    ]


def key_of(letter: Any) -> str:
    return str(letter.attributes["IdempotencyKey"]["StringValue"])


def relay(capsys: pytest.CaptureFixture[str], event: dict[str, Any], **env: str) -> tuple[Any, list[dict[str, Any]]]:
    """The relay's answer to ``event`` with ``env`` as its environment (destination variables by logical id), and its
    JSON lines (logs and the metrics blob)."""
    variables = {destination_variable(destination): address for destination, address in env.items()}
    return run(event, capsys, RelayHandler(variables, clock=Clock(CREATED_AT_MS / 1000 + 2.5)))


def metrics_of(lines: list[dict[str, Any]]) -> dict[str, Any]:
    (emf,) = [line for line in lines if "_aws" in line]
    return emf


def failures_logged(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("message") == "record not sent: retried from it"]


def test_a_queue_message_is_sent_with_its_body_and_its_key(sqs: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = queue(sqs, "receipts")
    (image,) = images(QueueMessage("ReceiptQueue", "ReceiptRequested", {"paymentId": "p-1"}))

    response, _ = relay(capsys, event(image), ReceiptQueue=url)

    assert response == {"batchItemFailures": []}
    (letter,) = drain(sqs, url)
    assert json.loads(letter.body) == {
        "eventType": "ReceiptRequested",
        "metadata": {"idempotencyKey": derived_key(RECORD_ID, 0)},
        "payload": {"paymentId": "p-1"},
    }
    assert key_of(letter) == derived_key(RECORD_ID, 0)


def test_a_fifo_queue_message_keeps_its_group_and_deduplication_ids_and_the_order(
    sqs: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = queue(sqs, "orders.fifo", FifoQueue="true")
    sent = images(
        QueueMessage("OrdersQueue", "OrderPlaced", {"n": 1}, group_id="order-7", deduplication_id="placed-7"),
        QueueMessage("OrdersQueue", "OrderPaid", {"n": 2}, group_id="order-7"),
        QueueMessage("OrdersQueue", "OrderShipped", {"n": 3}, group_id="order-7", raw=True),
    )

    response, _ = relay(capsys, event(*sent), OrdersQueue=url)

    assert response == {"batchItemFailures": []}
    expected = [(i[Attr.BODY]["S"], "order-7", i[Attr.DEDUPLICATION_ID]["S"]) for i in sent]
    assert fifo_ids(sqs, url) == expected
    assert expected[0][2] == "placed-7"
    assert expected[2][0] == '{"n":3}'


def test_a_standard_queue_gets_the_group_id_as_its_tenant_and_no_deduplication_id(
    sqs: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = queue(sqs, "receipts")
    (image,) = images(QueueMessage("ReceiptQueue", "ReceiptRequested", {"paymentId": "p-1"}, group_id="acc-1"))
    sent: list[dict[str, Any]] = []

    def recorded(**event: Any) -> None:
        sent.append(dict(event["params"]))

    # SQS refuses a deduplication id on a standard queue; moto does not, so the request itself is read (the relay's
    # clients come from botocore's default session: this test's own stands in).
    session = botocore.session.Session()
    session.register("provide-client-params.sqs.SendMessage", recorded)
    monkeypatch.setattr(botocore.session, "get_session", lambda: session)

    response, _ = relay(capsys, event(image), ReceiptQueue=url)

    assert response == {"batchItemFailures": []}
    assert image[Attr.DEDUPLICATION_ID]["S"]  # written, for a FIFO queue's sake
    (params,) = sent
    assert (params["MessageGroupId"], "MessageDeduplicationId" in params) == ("acc-1", False)


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
def test_a_topic_message_is_published_with_its_body_key_and_fifo_ids(
    sqs: Any, capsys: pytest.CaptureFixture[str], fifo: bool
) -> None:
    sns = boto3.client("sns", region_name=REGION)
    suffix = ".fifo" if fifo else ""
    topic = sns.create_topic(Name=f"notices{suffix}", Attributes={"FifoTopic": "true"} if fifo else {})["TopicArn"]
    url, arn = queue(sqs, f"notice-readers{suffix}", **({"FifoQueue": "true"} if fifo else {}))
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})
    group = "account-3" if fifo else None
    (image,) = images(TopicMessage("NoticeTopic", "PaymentNoticed", {"paymentId": "p-1"}, group_id=group))

    response, _ = relay(capsys, event(image), NoticeTopic=topic)

    assert response == {"batchItemFailures": []}
    if fifo:
        assert fifo_ids(sqs, url) == [(image[Attr.BODY]["S"], "account-3", image[Attr.DEDUPLICATION_ID]["S"])]
    else:
        (letter,) = drain(sqs, url)
        assert letter.body == image[Attr.BODY]["S"]
        assert key_of(letter) == derived_key(RECORD_ID, 0)


def test_a_bus_event_reaches_the_bus_with_its_source_detail_type_and_envelope(
    sqs: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    events = boto3.client("events", region_name=REGION)
    events.create_event_bus(Name="orders")
    url, arn = queue(sqs, "order-events")
    events.put_rule(Name="placed", EventBusName="orders", EventPattern=json.dumps({"source": ["shop.orders"]}))
    events.put_targets(Rule="placed", EventBusName="orders", Targets=[{"Id": "queue", "Arn": arn}])
    (image,) = images(BusEvent("OrdersBus", "OrderPlaced", {"orderId": "o-1"}, source="shop.orders"))

    response, _ = relay(capsys, event(image), OrdersBus="orders")

    assert response == {"batchItemFailures": []}
    (letter,) = drain(sqs, url)
    delivered = json.loads(letter.body)
    assert (delivered["source"], delivered["detail-type"]) == ("shop.orders", "OrderPlaced")
    assert delivered["detail"] == {
        "eventType": "OrderPlaced",
        "metadata": {"idempotencyKey": derived_key(RECORD_ID, 0)},
        "payload": {"orderId": "o-1"},
    }


def test_modified_and_removed_items_are_skipped_and_counted(sqs: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = queue(sqs, "receipts")
    again, expired, new = images(
        *(QueueMessage("ReceiptQueue", "ReceiptRequested", {"n": n}) for n in range(3)), record_id="PaymentReceived#p-9"
    )
    records = [stream_record(again, "1", "MODIFY"), stream_record(expired, "2", "REMOVE"), stream_record(new, "3")]

    response, lines = relay(capsys, {"Records": records}, ReceiptQueue=url)

    assert response == {"batchItemFailures": []}
    assert [key_of(letter) for letter in drain(sqs, url)] == [derived_key("PaymentReceived#p-9", 2)]
    emf = metrics_of(lines)
    assert (emf["messages_relayed"], emf["records_skipped"], emf["relay_failures"]) == ([1.0], [2.0], [0.0])
    assert emf["_aws"]["CloudWatchMetrics"][0]["Namespace"] == app.metrics.namespace


def test_the_first_record_that_cannot_be_sent_is_returned_and_nothing_after_it_is_sent(
    sqs: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = queue(sqs, "receipts")
    missing = url.replace("receipts", "deleted-queue")
    first, second, third = images(
        QueueMessage("ReceiptQueue", "ReceiptRequested", {"n": 1}),
        QueueMessage("AuditQueue", "PaymentAudited", {"n": 2}),
        QueueMessage("ReceiptQueue", "ReceiptRequested", {"n": 3}),
    )

    response, lines = relay(capsys, event(first, second, third), ReceiptQueue=url, AuditQueue=missing)

    assert response == {"batchItemFailures": [{"itemIdentifier": "101"}]}
    assert [key_of(letter) for letter in drain(sqs, url)] == [derived_key(RECORD_ID, 0)]
    (failure,) = failures_logged(lines)
    assert failure["sequence_number"] == "101"
    assert failure["idempotency_key"] == derived_key(RECORD_ID, 1)
    assert failure["destination"] == "AuditQueue"
    assert "NonExistentQueue" in failure["reason"]
    emf = metrics_of(lines)
    assert (emf["messages_relayed"], emf["relay_failures"]) == ([1.0], [1.0])


def test_a_destination_missing_from_the_environment_stops_the_batch_at_its_record(
    sqs: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = queue(sqs, "receipts")
    unknown, known = images(
        QueueMessage("RefundQueue", "RefundRequested", {"n": 1}), QueueMessage("ReceiptQueue", "ReceiptRequested", {})
    )

    response, lines = relay(capsys, event(unknown, known), ReceiptQueue=url)

    assert response == {"batchItemFailures": [{"itemIdentifier": "100"}]}
    assert drain(sqs, url) == []
    (failure,) = failures_logged(lines)
    assert failure["reason"] == "UnknownDestination"
    assert "REFUND_QUEUE_DESTINATION" in failure["detail"]
    assert failure["idempotency_key"] == derived_key(RECORD_ID, 0)


def _without(name: Attr) -> Any:
    return lambda image: {attribute: value for attribute, value in image.items() if attribute != name}


@pytest.mark.parametrize(
    ("spoil", "said"),
    [
        (_without(Attr.BODY), "'body'"),
        (lambda image: {**image, Attr.KIND: {"S": "fax"}}, "'fax'"),
        (lambda image: {**image, Attr.DESTINATION: {"N": "7"}}, "'destination'"),
        (lambda image: {**image, Attr.CREATED_AT_MS: {"N": "soon"}}, "soon"),
        (lambda image: {**image, Attr.KIND: {"S": "bus"}}, "source or detail type"),
        (lambda image: None, "no NewImage"),
    ],
    ids=["no body", "unknown kind", "destination not text", "creation time not a number", "bus without source", "none"],
)
def test_an_unreadable_image_stops_the_batch_at_its_record(
    sqs: Any, capsys: pytest.CaptureFixture[str], spoil: Any, said: str
) -> None:
    url, _ = queue(sqs, "receipts")
    good, spoilt, after = images(*(QueueMessage("ReceiptQueue", "ReceiptRequested", {"n": n}) for n in range(3)))
    records = event(good, spoilt, after)["Records"]
    records[1]["dynamodb"]["NewImage"] = spoil(spoilt)

    response, lines = relay(capsys, {"Records": records}, ReceiptQueue=url)

    assert response == {"batchItemFailures": [{"itemIdentifier": "101"}]}
    assert [key_of(letter) for letter in drain(sqs, url)] == [derived_key(RECORD_ID, 0)]
    (failure,) = failures_logged(lines)
    assert failure["reason"] == "UnreadableRecord"
    assert said in failure["detail"]
    # Read from the record's keys when its image cannot be.
    assert failure["idempotency_key"] == derived_key(RECORD_ID, 1)


def test_a_record_of_no_known_event_is_not_taken_for_one_to_skip(sqs: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = queue(sqs, "receipts")
    (image,) = images(QueueMessage("ReceiptQueue", "ReceiptRequested", {}))

    response, _ = relay(capsys, {"Records": [stream_record(image, "5", "UPSERT")]}, ReceiptQueue=url)

    assert response == {"batchItemFailures": [{"itemIdentifier": "5"}]}
    assert drain(sqs, url) == []


def test_a_bus_entry_eventbridge_refuses_stops_the_batch_with_its_error_code(
    sqs: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    boto3.client("events", region_name=REGION).create_event_bus(Name="orders")
    url, _ = queue(sqs, "receipts")
    placed, receipt = images(
        BusEvent("OrdersBus", "OrderPlaced", {"orderId": "o-1"}, source="shop.orders"),
        QueueMessage("ReceiptQueue", "ReceiptRequested", {}),
    )
    # PutEvents answers 200 and fails the entry whose detail is not a JSON object.
    placed[Attr.BODY] = {"S": "not json"}

    response, lines = relay(capsys, event(placed, receipt), OrdersBus="orders", ReceiptQueue=url)

    assert response == {"batchItemFailures": [{"itemIdentifier": "100"}]}
    assert drain(sqs, url) == []
    (failure,) = failures_logged(lines)
    assert failure["reason"] == "MalformedDetail"


def test_a_destination_that_cannot_be_reached_stops_the_batch_at_its_record(
    aws: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing listens there: botocore's own endpoint variable, as the function's environment would set it.
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", f"http://127.0.0.1:{free_port()}")
    (image,) = images(QueueMessage("ReceiptQueue", "ReceiptRequested", {}))

    response, lines = relay(capsys, event(image), ReceiptQueue="https://sqs.us-east-1.amazonaws.com/1/receipts")

    assert response == {"batchItemFailures": [{"itemIdentifier": "100"}]}
    (failure,) = failures_logged(lines)
    assert failure["reason"] == "EndpointConnectionError"


@pytest.mark.parametrize("event", [{}, {"Records": []}, {"Records": None}])
def test_an_event_without_records_sends_nothing_and_reports_no_failure(
    aws: None, capsys: pytest.CaptureFixture[str], event: dict[str, Any]
) -> None:
    response, lines = relay(capsys, event, ReceiptQueue="https://sqs.us-east-1.amazonaws.com/1/receipts")

    assert response == {"batchItemFailures": []}
    assert metrics_of(lines)["messages_relayed"] == [0.0]


def test_the_lag_is_now_less_the_oldest_sent_items_creation(sqs: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = queue(sqs, "receipts")
    older = images(QueueMessage("ReceiptQueue", "ReceiptRequested", {}), now_ms=CREATED_AT_MS - 700)
    newer = images(QueueMessage("ReceiptQueue", "ReceiptRequested", {}), record_id="PaymentReceived#p-2")

    _, lines = relay(capsys, event(*newer, *older), ReceiptQueue=url)

    # The relay's clock reads 2.5 s past CREATED_AT_MS.
    assert metrics_of(lines)["relay_lag_ms"] == [2500.0 + 700]


def test_only_the_services_sent_to_get_a_client(sqs: Any) -> None:
    url, _ = queue(sqs, "receipts")
    session = botocore.session.get_session()
    made: list[str] = []
    session.register("creating-client-class", lambda **kwargs: made.append(kwargs["event_name"].rpartition(".")[2]))
    (image,) = images(QueueMessage("ReceiptQueue", "ReceiptRequested", {}))
    relay_ = RelayHandler({"RECEIPT_QUEUE_DESTINATION": url}, session=session)

    relay_(event(image), LambdaContext())
    relay_(event(image, first_sequence=200), LambdaContext())

    assert made == ["sqs"]


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_destination_variable_fails_the_invocation_naming_it(aws: None, value: str) -> None:
    env = {
        "RECEIPT_QUEUE_DESTINATION": "https://sqs.us-east-1.amazonaws.com/1/receipts",
        "AUDIT_QUEUE_DESTINATION": value,
    }
    relay_ = RelayHandler(env)

    with pytest.raises(ConfigurationError, match="AUDIT_QUEUE_DESTINATION is empty"):
        relay_({"Records": []}, LambdaContext())
    assert not relay_.built


@pytest.mark.parametrize(
    ("audit_queue", "built_at_init"), [("https://sqs.us-east-1.amazonaws.com/1/audit", 1), ("", 0)]
)
def test_in_lambdas_runtime_the_relay_is_built_at_init_unless_a_setting_fails(
    audit_queue: str, built_at_init: int
) -> None:
    variables = {"AWS_LAMBDA_FUNCTION_NAME": "RelayFunction", "AUDIT_QUEUE_DESTINATION": audit_queue}
    script = (
        "from consumer import relay; from testkit.lambda_sqs import LambdaContext; print(int(relay.handler.built))\n"
        "try: relay.handler({'Records': []}, LambdaContext())\n"
        "except Exception as error: print(type(error).__name__, error)"
    )
    lines = fresh_interpreter(script, variables)
    built, *failed = [line for line in lines if not line.startswith("{")]
    assert int(built) == built_at_init
    # Left to fail the first invocation, with its cause.
    assert [line.startswith("ConfigurationError") and "AUDIT_QUEUE_DESTINATION" in line for line in failed] == (
        [] if built_at_init else [True]
    )
