"""The three systems measured, each a Lambda handler over the same records and table shapes: the baselines run the
consumer's own handlers (schema, webhook, ledger writes) and apply the writes one call each, as their users would, so
only the idempotency mechanism differs."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer, IdempotencyConfig, idempotent_function
from botocore.exceptions import ClientError

from consumer.config import Settings, table_variable
from consumer.envelope import Message, parse_message
from consumer.handler import MessageContext, MessageHandler, build_handlers
from testkit import application

if TYPE_CHECKING:
    from testkit.lambda_sqs import LambdaContext

# Which system a benchmark function runs (bench.function reads it at init).
SYSTEM_ENV = "BENCH_SYSTEM"


def settings_environment(settings: Settings) -> dict[str, str]:
    """The variables ``Settings.from_env`` reads ``settings`` back from."""
    tables = {table_variable(table): name for table, name in settings.table_names.items()}
    own = settings.model_dump(exclude={"table_names", "handler_variables"}).items()
    return {name.upper(): str(value) for name, value in own} | tables | settings.handler_variables


class ThisConsumer:
    """The deployed Lambda entry point, ``consumer.lambda_handler`` of the application's handlers, unchanged."""

    name = "this consumer"

    def __init__(self, settings: Settings, handlers: Mapping[str, MessageHandler[Any]] | None = None) -> None:
        """``handlers``: a test's own, in place of the registered ones (``wire(handlers=...)``)."""
        # Imported here, not by the Powertools function's cold start (bench.coldstart), which imports this module.
        from unittest import mock  # noqa: PLC0415

        from consumer import app  # noqa: PLC0415

        # A test's handlers are built already (with arguments of their own): the entry point takes them as built.
        classes = [type(handler) for handler in handlers.values()] if handlers else application.registered()
        built = mock.patch.object(app, "build_handlers", lambda *_: dict(handlers)) if handlers else nullcontext()
        function = app.lambda_handler(classes)
        with mock.patch.dict(os.environ, settings_environment(settings)), built:
            function.build_consumer()
        self._handler = function

    def handle(self, event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        return self._handler(event, context)


@dataclass(frozen=True)
class ParsedRecord:
    message: Message
    handler: MessageHandler[Any]
    payload: Any


class LedgerBusiness:
    """The consumer's handlers, their ledger writes made by calls of their own, not in a transaction with the record."""

    def __init__(self, client: Any, settings: Settings) -> None:
        self._handlers = build_handlers(application.registered(), settings)
        self._calls = {"Put": client.put_item, "Update": client.update_item, "Delete": client.delete_item}

    def parse(self, record: dict[str, Any]) -> ParsedRecord:
        message = parse_message(record)
        handler = self._handlers[message.event_type]
        return ParsedRecord(message, handler, handler.payload_model.model_validate(message.payload))

    def apply(self, parsed: ParsedRecord, remaining_ms: Callable[[], int]) -> Any:
        """Run the handler, then its writes in order, one DynamoDB call each; return its result."""
        message = parsed.message
        context = MessageContext(
            message_id=message.message_id,
            idempotency_key=message.idempotency_key,
            receive_count=message.receive_count,
            remaining_ms=remaining_ms,
        )
        effect = parsed.handler.handle(parsed.payload, context)
        for write in effect.writes:
            ((action, request),) = write.to_transact_item().items()
            self._calls[action](**request)
        return effect.result


class PowertoolsBaseline:
    """``BatchProcessor`` with ``idempotent_function`` on DynamoDB, composed as its documentation does for SQS, with
    payload validation (like the consumer's key-reuse check) and an in-progress record expiring with the invocation."""

    name = "Powertools"

    def __init__(self, settings: Settings) -> None:
        client = boto3.session.Session().client("dynamodb")
        persistence = DynamoDBPersistenceLayer(table_name=settings.idempotency_table_name, boto3_client=client)
        self._config = IdempotencyConfig(
            event_key_jmespath="powertools_json(body).[eventType, metadata.idempotencyKey]",
            payload_validation_jmespath="powertools_json(body).payload",
            expires_after_seconds=settings.idempotency_ttl_seconds,
        )
        self._processor = BatchProcessor(event_type=EventType.SQS)
        self._context: LambdaContext | None = None
        business = LedgerBusiness(client, settings)

        @idempotent_function(data_keyword_argument="record", persistence_store=persistence, config=self._config)
        def record_handler(record: SQSRecord) -> Any:
            assert self._context is not None
            return business.apply(business.parse(record.raw_event), self._context.get_remaining_time_in_millis)

        # Logs and metrics per batch as this consumer has them: Powertools' Logger and Metrics.
        self._logger, self._metrics = Logger(), Metrics()
        self._record_handler = record_handler
        self._handle = self._metrics.log_metrics(self._logger.inject_lambda_context(self._process, clear_state=True))

    def handle(self, event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        return dict(self._handle(event, context))

    def _process(self, event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        self._context = context
        # Powertools types the context as its own class; Lambda passes any object of that shape.
        self._config.register_lambda_context(context)  # type: ignore[arg-type]
        response = process_partial_response(
            event=event,
            record_handler=self._record_handler,
            processor=self._processor,
            context=context,  # type: ignore[arg-type]
        )
        failures, records = len(response.get("batchItemFailures") or []), len(event["Records"])
        self._metrics.add_metric(name="failed", unit=MetricUnit.Count, value=failures)
        self._logger.info("batch done", extra={"records": records, "failures": failures})
        return dict(response)


class SeedPattern:
    """The seed articles' pattern, one record after another: claim, apply, mark COMPLETED, one call each."""

    name = "seed pattern"

    def __init__(self, settings: Settings) -> None:
        self._client = boto3.session.Session().client("dynamodb")
        self._table = settings.idempotency_table_name
        self._ttl_seconds = settings.idempotency_ttl_seconds
        self._business = LedgerBusiness(self._client, settings)

    def handle(self, event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        failures = []
        for record in event["Records"]:
            try:
                self._process(record, context)
            except Exception:
                failures.append({"itemIdentifier": record["messageId"]})
        return {"batchItemFailures": failures}

    def _process(self, record: dict[str, Any], context: LambdaContext) -> None:
        parsed = self._business.parse(record)
        key = {"id": {"S": parsed.message.record_id}}
        try:
            expires_at = str(int(time.time()) + self._ttl_seconds)
            item = {**key, "status": {"S": "IN_PROGRESS"}, "expiresAt": {"N": expires_at}}
            self._client.put_item(TableName=self._table, Item=item, ConditionExpression="attribute_not_exists(id)")
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            existing = self._client.get_item(TableName=self._table, Key=key, ConsistentRead=True).get("Item", {})
            if existing.get("status", {}).get("S") == "COMPLETED":
                return
            raise RuntimeError(f"{parsed.message.record_id} is in progress under another delivery") from None
        self._business.apply(parsed, context.get_remaining_time_in_millis)
        self._client.update_item(
            TableName=self._table,
            Key=key,
            UpdateExpression="SET #status = :completed",
            ExpressionAttributeNames={"#status": "status"},
            ExpressionAttributeValues={":completed": {"S": "COMPLETED"}},
        )


System = ThisConsumer | PowertoolsBaseline | SeedPattern
# In display order: this consumer first, then the baselines.
SYSTEMS: tuple[type[System], ...] = (ThisConsumer, PowertoolsBaseline, SeedPattern)
NAMES = [system.name for system in SYSTEMS]
