"""Powertools for AWS Lambda: ``BatchProcessor`` with ``idempotent_function`` on DynamoDB.

The way its documentation composes them for SQS: a record handler made idempotent on
the body's key (payload validation on, like the consumer's key-reuse check), the
Lambda context registered so an in-progress record expires with the invocation, and
the business writes done inside the idempotent function, apart from the record.
"""

from __future__ import annotations

from typing import Any

import boto3
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

from bench.systems.business import LedgerBusiness
from consumer.config import Settings
from testkit.lambda_sqs import LambdaContext


class PowertoolsBaseline:
    name = "Powertools"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
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

        self._record_handler = record_handler

    def handle(self, event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        self._context = context
        # Powertools types the context as its own class; Lambda passes any object of that shape.
        self._config.register_lambda_context(context)  # type: ignore[arg-type]
        return dict(
            process_partial_response(
                event=event,
                record_handler=self._record_handler,
                processor=self._processor,
                context=context,  # type: ignore[arg-type]
            )
        )
