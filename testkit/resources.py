"""Create the template's queues and tables on the local servers, and describe its functions.

A resource is created the first time something refers to it, so the dead-letter queue exists before the queue whose
redrive policy names it. Names follow CloudFormation (an explicit ``QueueName``/``TableName``, otherwise
``<stack>-<LogicalId>``). SSE, point-in-time recovery and deletion protection mean nothing locally and are not applied.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consumer.config import table_parameter
from testkit.tables import TABLE_TYPE as TABLE
from testkit.tables import create_table
from testkit.template import ACCOUNT_ID, LOCAL_TABLES, PARTITION, Template, TemplateError

QUEUE = "AWS::SQS::Queue"
FUNCTIONS = ("AWS::Serverless::Function", "AWS::Lambda::Function")
_NOT_QUEUE_ATTRIBUTES = ("QueueName", "Tags")
# SAM's defaults when a function or its SQS event leaves them out.
_DEFAULT_TIMEOUT_S = 3
_DEFAULT_MEMORY_MB = 128
_DEFAULT_BATCH_SIZE = 10
# A stream mapping's MaximumRetryAttempts of -1: retried until the record expires, which a local stream's never do.
_UNBOUNDED = 2**31


@dataclass(frozen=True)
class QueueResource:
    logical_id: str
    name: str
    url: str
    arn: str
    attributes: dict[str, str]

    @property
    def fifo(self) -> bool:
        return self.name.endswith(".fifo")


@dataclass(frozen=True)
class TableResource:
    name: str
    arn: str
    stream_arn: str | None = None  # its stream's, when the template gives it one (the outbox's)


@dataclass(frozen=True)
class SqsTrigger:
    """The function's SQS event: what Lambda's event source mapping is configured with."""

    queue_logical_id: str
    queue_arn: str
    batch_size: int
    batching_window_s: int
    report_batch_item_failures: bool


@dataclass(frozen=True)
class StreamTrigger:
    """The function's DynamoDB stream event: what Lambda's event source mapping is configured with."""

    table_logical_id: str
    stream_arn: str
    batch_size: int
    report_failures: bool
    bisect_on_error: bool
    maximum_retry_attempts: int
    # The on-failure queue's URL, if it has one.
    on_failure_url: str | None = None


@dataclass(frozen=True)
class FunctionSpec:
    logical_id: str
    name: str
    arn: str
    handler: str
    code_dir: Path
    timeout_s: int
    memory_mb: int
    environment: dict[str, str] = field(default_factory=dict)
    triggers: tuple[SqsTrigger, ...] = ()
    streams: tuple[StreamTrigger, ...] = ()


@dataclass(frozen=True)
class LocalResources:
    stack_name: str
    queues: dict[str, QueueResource]
    tables: dict[str, TableResource]
    functions: dict[str, FunctionSpec]

    def dead_letter_queue(self, queue: QueueResource) -> QueueResource:
        return _queue_by_arn(self.queues, json.loads(queue.attributes["RedrivePolicy"])["deadLetterTargetArn"])

    def function(self, logical_id: str | None = None) -> FunctionSpec:
        """The named function, or the template's only one the queue feeds: the consumer (the relay reads a stream)."""
        if logical_id is not None:
            return self.functions[logical_id]
        fed = [function for function in self.functions.values() if function.triggers]
        if len(fed) != 1:
            raise TemplateError(f"name the function: the template has {sorted(self.functions)}")
        return fed[0]


class _Resolver:
    """Supplies physical ids to the template, creating queues and tables on first use."""

    def __init__(self, template: Template, sqs: Any, dynamodb: Any) -> None:
        self._template = template
        self._sqs = sqs
        self._dynamodb = dynamodb
        self.queues: dict[str, QueueResource] = {}
        self.tables: dict[str, TableResource] = {}
        self._creating: set[str] = set()

    def _arn(self, service: str, resource: str) -> str:
        return f"arn:{PARTITION}:{service}:{self._template.region}:{ACCOUNT_ID}:{resource}"

    def _default_name(self, logical_id: str) -> str:
        return f"{self._template.stack_name}-{logical_id}"

    def _type(self, logical_id: str) -> str:
        return self._template.resources[logical_id].get("Type", "")

    def ref(self, logical_id: str) -> str:
        kind = self._type(logical_id)
        if kind == QUEUE:
            return self.queue(logical_id).url
        if kind == TABLE:
            return self.table(logical_id).name
        return self._default_name(logical_id)

    def get_att(self, logical_id: str, attribute: str) -> str:
        kind = self._type(logical_id)
        if kind == QUEUE:
            queue = self.queue(logical_id)
            return {"Arn": queue.arn, "QueueName": queue.name, "QueueUrl": queue.url}[attribute]
        if kind == TABLE and attribute == "StreamArn" and self.table(logical_id).stream_arn:
            return str(self.table(logical_id).stream_arn)
        if attribute != "Arn":
            raise TemplateError(f"GetAtt {logical_id}.{attribute} is not supported by the local stack")
        name = self._default_name(logical_id)
        if kind == TABLE:
            return self.table(logical_id).arn
        if kind in FUNCTIONS:
            return self._arn("lambda", f"function:{name}")
        if kind == "AWS::IAM::Role":
            return f"arn:{PARTITION}:iam::{ACCOUNT_ID}:role/{name}"
        if kind == "AWS::Logs::LogGroup":
            return self._arn("logs", f"log-group:{name}:*")
        return self._arn("local", name)

    def _properties_to_create(self, logical_id: str) -> dict[str, Any]:
        if logical_id in self._creating:
            raise TemplateError(f"circular reference through {logical_id}")
        self._creating.add(logical_id)
        return self._template.properties(logical_id, self)

    def queue(self, logical_id: str) -> QueueResource:
        if logical_id in self.queues:
            return self.queues[logical_id]
        properties = self._properties_to_create(logical_id)
        fifo = str(properties.get("FifoQueue", "")).lower() == "true"
        name = properties.get("QueueName") or self._default_name(logical_id) + (".fifo" if fifo else "")
        attributes = queue_attributes(properties)
        url = self._sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        arn = self._sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.queues[logical_id] = QueueResource(logical_id, name, url, arn, attributes)
        return self.queues[logical_id]

    def table(self, logical_id: str) -> TableResource:
        if logical_id in self.tables:
            return self.tables[logical_id]
        # One given by a parameter is made from its LocalTables keys, named by the parameter's value.
        given = (
            None if logical_id in self._template.resources else self._template.parameters[table_parameter(logical_id)]
        )
        properties = self._template.local(LOCAL_TABLES)[logical_id] if given else self._properties_to_create(logical_id)
        name = given or properties.get("TableName") or self._default_name(logical_id)
        create_table(self._dynamodb, name, properties)
        arn = self._arn("dynamodb", f"table/{name}")
        stream = self._dynamodb.describe_table(TableName=name)["Table"].get("LatestStreamArn")
        self.tables[logical_id] = TableResource(name, arn, stream)
        return self.tables[logical_id]

    def function(self, logical_id: str) -> FunctionSpec:
        properties = self._template.properties(logical_id, self)
        name = properties.get("FunctionName") or self._default_name(logical_id)
        variables = (properties.get("Environment") or {}).get("Variables") or {}
        events = (properties.get("Events") or {}).values()
        template_dir = self._template.path.parent if self._template.path else Path.cwd()
        return FunctionSpec(
            logical_id=logical_id,
            name=name,
            arn=self._arn("lambda", f"function:{name}"),
            handler=str(properties["Handler"]),
            code_dir=(template_dir / str(properties.get("CodeUri", "."))).resolve(),
            timeout_s=int(properties.get("Timeout", _DEFAULT_TIMEOUT_S)),
            memory_mb=int(properties.get("MemorySize", _DEFAULT_MEMORY_MB)),
            environment={key: _string(value) for key, value in variables.items()},
            triggers=tuple(self._trigger(event["Properties"]) for event in events if event.get("Type") == "SQS"),
            streams=tuple(self._stream(event["Properties"]) for event in events if event.get("Type") == "DynamoDB"),
        )

    def _stream(self, event: dict[str, Any]) -> StreamTrigger:
        (table,) = [logical_id for logical_id, table in self.tables.items() if table.stream_arn == event["Stream"]]
        destination = ((event.get("DestinationConfig") or {}).get("OnFailure") or {}).get("Destination")
        attempts = int(event.get("MaximumRetryAttempts", -1))
        return StreamTrigger(
            table_logical_id=table,
            stream_arn=event["Stream"],
            batch_size=int(event.get("BatchSize", 100)),
            report_failures="ReportBatchItemFailures" in (event.get("FunctionResponseTypes") or []),
            bisect_on_error=bool(event.get("BisectBatchOnFunctionError", False)),
            maximum_retry_attempts=attempts if attempts >= 0 else _UNBOUNDED,
            on_failure_url=_queue_by_arn(self.queues, destination).url if destination else None,
        )

    def _trigger(self, event: dict[str, Any]) -> SqsTrigger:
        return SqsTrigger(
            queue_logical_id=_queue_by_arn(self.queues, event["Queue"]).logical_id,
            queue_arn=event["Queue"],
            batch_size=int(event.get("BatchSize", _DEFAULT_BATCH_SIZE)),
            batching_window_s=int(event.get("MaximumBatchingWindowInSeconds", 0)),
            report_batch_item_failures="ReportBatchItemFailures" in (event.get("FunctionResponseTypes") or []),
        )


def _queue_by_arn(queues: dict[str, QueueResource], arn: str) -> QueueResource:
    return {queue.arn: queue for queue in queues.values()}[arn]


def queue_attributes(properties: dict[str, Any]) -> dict[str, str]:
    return {key: _string(value) for key, value in properties.items() if key not in _NOT_QUEUE_ATTRIBUTES}


def _string(value: Any) -> str:
    """A property's value as AWS stores it in a string: JSON documents, lowercase booleans."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return json.dumps(value)
    return "" if value is None else str(value)


def create_resources(template: Template, sqs: Any, dynamodb: Any) -> LocalResources:
    resolver = _Resolver(template, sqs, dynamodb)
    for logical_id in template.resources_of_type(QUEUE):
        resolver.queue(logical_id)
    for logical_id in [*template.resources_of_type(TABLE), *template.local(LOCAL_TABLES)]:
        resolver.table(logical_id)
    functions = {
        logical_id: resolver.function(logical_id)
        for kind in FUNCTIONS
        for logical_id in template.resources_of_type(kind)
    }
    return LocalResources(template.stack_name, dict(resolver.queues), dict(resolver.tables), functions)
