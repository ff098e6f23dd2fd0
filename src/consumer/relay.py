"""The relay: the outbox table's stream in, each committed message out to its queue, topic or bus.

An outbox item exists if and only if the effect that emitted it committed (``consumer.outbox``). The table's stream
feeds this function, the core's second (``Handler: consumer.relay.handler``), through an event source mapping that
reports batch item failures, bisects a batch that fails the function, retries a bounded number of times and then
hands the record to an on-failure queue. It never imports the application: each item names its destination's logical
id, and the relay's environment carries that destination's address under ``consumer.config.destination_variable``'s
name (``RECEIPT_QUEUE_DESTINATION``: a queue's URL, a topic's ARN, a bus's name).

Each new item (``INSERT``) is sent in the order of the stream, one call per item: ``SendMessage``, ``Publish`` or
``PutEvents``, with the item's key in the ``IdempotencyKey`` attribute (a bus event carries it in its detail, the
envelope). A ``MODIFY`` is an item put again after its source's idempotency record expired and the message was applied
again: its key was sent when it was inserted, so it is skipped, as is a ``REMOVE`` (the table's TTL). At the first item
that cannot be sent the relay stops and names that record in ``batchItemFailures``: Lambda checkpoints what preceded it
and retries from it, so no item is sent ahead of an earlier one of its shard.

Delivery is at least once. A crash or a timeout after a send and before Lambda's checkpoint sends the item again, with
the same body and the same key: a consumer that dedupes by the key, as this project's does, applies it once, and a FIFO
queue or topic drops the copy itself within its 5-minute deduplication window (the item's deduplication id is sent
again). Exactly once would need the destination to join the outbox's transaction, which none of SQS, SNS and
EventBridge can.

Endpoints come from botocore's own ``AWS_ENDPOINT_URL*`` variables: there is no local code path.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import botocore.session
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from consumer.app import Response, metrics
from consumer.config import destination_variable
from consumer.errors import ConfigurationError
from consumer.outbox import Attr, Kind, OutboxItem
from consumer.outcome import Log
from consumer.wiring import LazyClient, _client, logger

if TYPE_CHECKING:
    from consumer.wiring import Session

__all__ = ["METRICS", "NotSent", "Relay", "RelayHandler", "RelaySettings", "Relayed", "Sender", "handler", "read_item"]

_SUFFIX = "_DESTINATION"
# The relay's EMF metrics, under the consumer's namespace and service (the dashboard charts each).
SENT, SKIPPED, FAILURES, LAG_MS = "messages_relayed", "records_skipped", "relay_failures", "relay_lag_ms"
METRICS = (SENT, SKIPPED, FAILURES, LAG_MS)
# How a FIFO queue's URL and a FIFO topic's ARN end.
_FIFO = ".fifo"

# The stream's event names: only a new item is a message to send.
_INSERT = "INSERT"
_SKIPPED = frozenset({"MODIFY", "REMOVE"})


@dataclass(frozen=True)
class RelaySettings:
    """Where the relay sends: each ``*_DESTINATION`` variable's address, by the variable's name."""

    addresses: Mapping[str, str]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RelaySettings:
        """Every variable ending in ``_DESTINATION``; raise ``ConfigurationError`` naming each that is empty."""
        env = os.environ if env is None else env
        addresses = {name: value.strip() for name, value in env.items() if name.endswith(_SUFFIX)}
        empty = sorted(name for name, address in addresses.items() if not address)
        if empty:
            raise ConfigurationError(
                f"environment variable {', '.join(empty)} is empty: a *{_SUFFIX} variable carries the address the"
                " relay sends to (a queue's URL, a topic's ARN, a bus's name)"
            )
        return cls(addresses)

    def address(self, destination: str) -> str | None:
        """The address of a destination's logical id (ReceiptQueue: RECEIPT_QUEUE_DESTINATION's), or None."""
        return self.addresses.get(destination_variable(destination))


class NotSent(Exception):
    """Why one record was not sent: ``reason`` is a short name (an AWS error code, ``UnreadableRecord``...)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Sender:
    """One call per item; each service's client is made from ``session`` when its first item comes (a relay that only
    sends to queues never builds an SNS or an EventBridge client)."""

    def __init__(self, session: Session) -> None:
        config = Config(
            connect_timeout=2,
            read_timeout=5,
            # botocore's own retries absorb a throttle or a dropped connection; past them, Lambda retries the record.
            retries={"mode": "standard", "max_attempts": 3},
        )
        # Any: the SNS and EventBridge stubs are not installed, and the calls take the optional FIFO ids as a mapping.
        self._clients: dict[str, LazyClient[Any]] = {
            service: LazyClient(partial(_client, session, service, config)) for service in ("sqs", "sns", "events")
        }

    def send(self, item: OutboxItem, address: str) -> None:
        """Send ``item`` to ``address``; raise ``NotSent`` when it was refused or could not be delivered."""
        try:
            self._send(item, address)
        except ClientError as error:
            code = str(error.response.get("Error", {}).get("Code") or "ClientError")
            raise NotSent(code, str(error)) from None
        except BotoCoreError as error:
            # A connection refused or dropped, a timeout, a request botocore would not build: try again later.
            raise NotSent(type(error).__name__, str(error)) from None

    def _send(self, item: OutboxItem, address: str) -> None:
        attributes = {"IdempotencyKey": {"DataType": "String", "StringValue": item.key}}
        # A deduplication id is for FIFO queues and topics only (SQS and SNS refuse it elsewhere); a group id is a
        # standard queue's fair-queue tenant too.
        deduplication_id = item.deduplication_id if address.endswith(_FIFO) else None
        fifo = {
            name: value
            for name, value in (("MessageGroupId", item.group_id), ("MessageDeduplicationId", deduplication_id))
            if value is not None
        }
        if item.kind is Kind.QUEUE:
            self._clients["sqs"].get().send_message(
                QueueUrl=address, MessageBody=item.body, MessageAttributes=attributes, **fifo
            )
        elif item.kind is Kind.TOPIC:
            self._clients["sns"].get().publish(
                TopicArn=address, Message=item.body, MessageAttributes=attributes, **fifo
            )
        else:
            entry = {
                "EventBusName": address,
                "Source": item.source,
                "DetailType": item.detail_type,
                "Detail": item.body,
            }
            answer = self._clients["events"].get().put_events(Entries=[entry])
            # PutEvents answers 200 when an entry is refused: the entry says why.
            if answer.get("FailedEntryCount", 0):
                refused = (answer.get("Entries") or [{}])[0]
                raise NotSent(str(refused.get("ErrorCode") or "FailedEntry"), str(refused.get("ErrorMessage") or ""))


def read_item(image: object) -> OutboxItem:
    """The outbox item of a stream record's ``NewImage``; raise ``NotSent`` naming what cannot be read."""
    if not isinstance(image, Mapping):
        raise NotSent("UnreadableRecord", "the record has no NewImage (is the stream's view NEW_IMAGE?)")
    try:
        return OutboxItem.from_image(image)
    except ValueError as error:
        raise NotSent("UnreadableRecord", str(error)) from None


@dataclass
class Relayed:
    """What one batch of stream records came to."""

    sent: int = 0
    skipped: int = 0
    # The sequence number of the record the batch stopped at: Lambda retries from it.
    failed_at: str | None = None
    # Now less the oldest sent item's ``createdAtMs``: how far behind its effects the chain delivers.
    lag_ms: int | None = None

    def response(self) -> Response:
        """The partial batch response of a stream: the one record to retry from, or none."""
        return {"batchItemFailures": [] if self.failed_at is None else [{"itemIdentifier": self.failed_at}]}


class Relay:
    """Sends a batch's records in order, stopping at the first that cannot be sent; never raises for one record."""

    def __init__(
        self, settings: RelaySettings, sender: Sender, *, clock: Callable[[], float] = time.time, logger: Log = logger
    ) -> None:
        self._settings = settings
        self._sender = sender
        self._clock = clock
        self._logger = logger

    def relay(self, records: Iterable[object]) -> Relayed:
        """Send each ``INSERT``'s item, skip each ``MODIFY`` and ``REMOVE``; stop at the first record not sent."""
        done = Relayed()
        for record in records:
            fields = record if isinstance(record, Mapping) else {}
            stream = fields.get("dynamodb")
            stream = stream if isinstance(stream, Mapping) else {}
            event_name = fields.get("eventName")
            if isinstance(event_name, str) and event_name in _SKIPPED:
                done.skipped += 1
                continue
            # Without its sequence number a record cannot be named: "" makes Lambda retry the whole batch instead.
            sequence = str(stream.get("SequenceNumber") or "")
            item: OutboxItem | None = None
            try:
                if event_name != _INSERT:
                    raise NotSent("UnreadableRecord", f"the record's eventName is {str(event_name)[:40]!r}")
                item = read_item(stream.get("NewImage"))
                address = self._settings.address(item.destination)
                if address is None:
                    variable = destination_variable(item.destination)
                    raise NotSent("UnknownDestination", f"{variable} (destination {item.destination}) is not set")
                self._sender.send(item, address)
            except NotSent as error:
                self._logger.error(
                    "record not sent: retried from it",
                    extra={
                        "reason": error.reason,
                        "detail": error.detail[:1_000],
                        "sequence_number": sequence,
                        "idempotency_key": item.key if item else _stream_key(stream),
                        **({"destination": item.destination} if item else {}),
                    },
                )
                done.failed_at = sequence
                return done
            done.sent += 1
            if item.created_at_ms is not None:
                lag_ms = int(self._clock() * 1000) - item.created_at_ms
                done.lag_ms = lag_ms if done.lag_ms is None else max(done.lag_ms, lag_ms)
        return done


def _stream_key(stream: Mapping[Any, Any]) -> str:
    """The record's outbox key from its ``Keys`` when its image cannot be read: for the log line only."""
    keys = stream.get("Keys")
    key = keys.get(Attr.ID) if isinstance(keys, Mapping) else None
    return str(key.get("S", "")) if isinstance(key, Mapping) else ""


class RelayHandler:
    """The relay function's handler: ``handler(event, context)``, as Lambda calls it with the outbox's stream."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        session: Session | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._env = env
        self._session = session
        self._clock = clock
        self._relay: Relay | None = None
        self._entry: Callable[[object, LambdaContext], Response] = metrics.log_metrics(
            logger.inject_lambda_context(clear_state=True)(self._handle)
        )

    def build_relay(self) -> Relay:
        """The relay of this container, built once after its settings are read (in Lambda, during init)."""
        # Lambda's runtime calls a handler one invocation at a time: no lock.
        if self._relay is None:
            settings = RelaySettings.from_env(self._env)
            sender = Sender(self._session or botocore.session.get_session())
            self._relay = Relay(settings, sender, clock=self._clock)
        return self._relay

    @property
    def built(self) -> bool:
        """Whether the relay is built: in Lambda's runtime, during init, unless its settings failed their check."""
        return self._relay is not None

    def __call__(self, event: object, context: Any) -> Response:
        """Send the event's outbox records in order.

        Parameters
        ----------
        event
            DynamoDB stream records of the outbox table, ``{"Records": [...]}``; each ``INSERT``'s ``NewImage`` is an
            outbox item (``consumer.outbox.OutboxItem``).
        context
            Lambda's context object.

        Returns
        -------
        dict
            ``{"batchItemFailures": [{"itemIdentifier": <SequenceNumber>}]}`` naming the first record that could not
            be sent (Lambda retries from it), or an empty list when every record was sent or skipped.

        Examples
        --------
        In template.yaml, the relay function's ``Handler: consumer.relay.handler``, its event source the outbox table's
        stream with ``FunctionResponseTypes: [ReportBatchItemFailures]``.

        Limitations
        -----------
        At least once: a crash between a send and Lambda's checkpoint sends the item again, with the same key. A
        ``*_DESTINATION`` variable that is empty fails every invocation with its name, before any record is sent; a
        record whose destination has no variable is retried until it is, or until the mapping gives it up.
        """
        # Any: Lambda passes its runtime's context object, tests and tools their own of the same shape.
        return self._entry(event, context)

    def _handle(self, event: object, context: LambdaContext) -> Response:
        relay = self.build_relay()
        records = event.get("Records") if isinstance(event, Mapping) else None
        done = relay.relay(records if isinstance(records, list) else ())
        failures = 0 if done.failed_at is None else 1
        metrics.add_metric(name=SENT, unit=MetricUnit.Count, value=done.sent)
        metrics.add_metric(name=SKIPPED, unit=MetricUnit.Count, value=done.skipped)
        metrics.add_metric(name=FAILURES, unit=MetricUnit.Count, value=failures)
        if done.lag_ms is not None:
            metrics.add_metric(name=LAG_MS, unit=MetricUnit.Milliseconds, value=done.lag_ms)
        logger.info(
            "relay batch done",
            extra={"sent": done.sent, "skipped": done.skipped, "failed_at": done.failed_at, "lag_ms": done.lag_ms},
        )
        return done.response()


handler = RelayHandler()
if "AWS_LAMBDA_FUNCTION_NAME" in os.environ:
    # Built during init, on Lambda's full vCPU; a bad setting is left to fail the first invocation with its cause.
    with contextlib.suppress(ConfigurationError):
        handler.build_relay()
