"""Create the template's queues and tables on the local servers, and describe its function.

A resource is created the first time something refers to it (``Ref``/``GetAtt`` while
resolving another resource's properties), so the dead-letter queue exists before the
queue whose redrive policy names it, whatever order the template lists them in.
Names follow CloudFormation: an explicit ``QueueName``/``TableName``, otherwise
``<stack>-<LogicalId>``. SSE, point-in-time recovery and deletion protection have no
meaning on the local servers and are not applied; everything the consumer's behaviour
depends on is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.tables import TABLE_TYPE as TABLE
from testkit.tables import create_table, ttl_attribute
from testkit.template import ACCOUNT_ID, PARTITION, Template, TemplateError

QUEUE = "AWS::SQS::Queue"
FUNCTIONS = ("AWS::Serverless::Function", "AWS::Lambda::Function")
# CloudFormation property -> SQS attribute, where they differ only in being JSON documents.
_JSON_QUEUE_ATTRIBUTES = ("RedrivePolicy", "RedriveAllowPolicy")
_NOT_QUEUE_ATTRIBUTES = ("QueueName", "Tags")
# SAM's defaults when a function or its SQS event leaves them out.
_DEFAULT_TIMEOUT_S = 3
_DEFAULT_MEMORY_MB = 128
_DEFAULT_BATCH_SIZE = 10


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
    logical_id: str
    name: str
    arn: str
    ttl_attribute: str | None


@dataclass(frozen=True)
class SqsTrigger:
    """The function's SQS event: what Lambda's event source mapping is configured with."""

    queue_logical_id: str
    queue_arn: str
    batch_size: int
    batching_window_s: int
    report_batch_item_failures: bool
    maximum_concurrency: int | None


@dataclass(frozen=True)
class FunctionSpec:
    logical_id: str
    name: str
    arn: str
    handler: str
    code_dir: Path
    timeout_s: int
    memory_mb: int
    environment: dict[str, str]
    triggers: tuple[SqsTrigger, ...]


@dataclass(frozen=True)
class LocalResources:
    stack_name: str
    queues: dict[str, QueueResource]
    tables: dict[str, TableResource]
    functions: dict[str, FunctionSpec]

    def queue_by_arn(self, arn: str) -> QueueResource:
        for queue in self.queues.values():
            if queue.arn == arn:
                return queue
        raise KeyError(f"no queue with ARN {arn}")

    def dead_letter_queue(self, queue: QueueResource) -> QueueResource:
        """The queue that ``queue``'s redrive policy names."""
        return self.queue_by_arn(json.loads(queue.attributes["RedrivePolicy"])["deadLetterTargetArn"])

    def function(self, logical_id: str | None = None) -> FunctionSpec:
        """The named function, or the template's only one."""
        if logical_id is not None:
            return self.functions[logical_id]
        if len(self.functions) != 1:
            raise TemplateError(f"name the function: the template has {sorted(self.functions)}")
        return next(iter(self.functions.values()))


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
        if kind == TABLE:
            table = self.table(logical_id)
            if attribute == "Arn":
                return table.arn
        if attribute == "Arn":
            name = self._default_name(logical_id)
            if kind in FUNCTIONS:
                return self._arn("lambda", f"function:{name}")
            if kind == "AWS::IAM::Role":
                return f"arn:{PARTITION}:iam::{ACCOUNT_ID}:role/{name}"
            if kind == "AWS::Logs::LogGroup":
                return self._arn("logs", f"log-group:{name}:*")
            return self._arn("local", name)
        raise TemplateError(f"GetAtt {logical_id}.{attribute} is not supported by the local stack")

    def _guard(self, logical_id: str) -> None:
        if logical_id in self._creating:
            raise TemplateError(f"circular reference through {logical_id}")
        self._creating.add(logical_id)

    def queue(self, logical_id: str) -> QueueResource:
        if logical_id in self.queues:
            return self.queues[logical_id]
        self._guard(logical_id)
        properties = self._template.properties(logical_id, self)
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
        self._guard(logical_id)
        properties = self._template.properties(logical_id, self)
        name = properties.get("TableName") or self._default_name(logical_id)
        create_table(self._dynamodb, name, properties)
        arn = self._arn("dynamodb", f"table/{name}")
        self.tables[logical_id] = TableResource(logical_id, name, arn, ttl_attribute(properties))
        return self.tables[logical_id]

    def function(self, logical_id: str) -> FunctionSpec:
        properties = self._template.properties(logical_id, self)
        name = properties.get("FunctionName") or self._default_name(logical_id)
        variables = (properties.get("Environment") or {}).get("Variables") or {}
        triggers = []
        for event in (properties.get("Events") or {}).values():
            if event.get("Type") != "SQS":
                continue
            event_properties = event.get("Properties") or {}
            queue_arn = event_properties["Queue"]
            queue = next(queue for queue in self.queues.values() if queue.arn == queue_arn)
            triggers.append(
                SqsTrigger(
                    queue_logical_id=queue.logical_id,
                    queue_arn=queue_arn,
                    batch_size=int(event_properties.get("BatchSize", _DEFAULT_BATCH_SIZE)),
                    batching_window_s=int(event_properties.get("MaximumBatchingWindowInSeconds", 0)),
                    report_batch_item_failures="ReportBatchItemFailures"
                    in (event_properties.get("FunctionResponseTypes") or []),
                    maximum_concurrency=_optional_int(
                        (event_properties.get("ScalingConfig") or {}).get("MaximumConcurrency")
                    ),
                )
            )
        template_dir = self._template.path.parent if self._template.path else Path.cwd()
        return FunctionSpec(
            logical_id=logical_id,
            name=name,
            arn=self._arn("lambda", f"function:{name}"),
            handler=str(properties["Handler"]),
            code_dir=(template_dir / str(properties.get("CodeUri", "."))).resolve(),
            timeout_s=int(properties.get("Timeout", _DEFAULT_TIMEOUT_S)),
            memory_mb=int(properties.get("MemorySize", _DEFAULT_MEMORY_MB)),
            environment={key: _env_value(value) for key, value in variables.items()},
            triggers=tuple(triggers),
        )


def queue_attributes(properties: dict[str, Any]) -> dict[str, str]:
    """CloudFormation queue properties as the string attributes ``CreateQueue`` takes."""
    attributes: dict[str, str] = {}
    for key, value in properties.items():
        if key in _NOT_QUEUE_ATTRIBUTES:
            continue
        if key in _JSON_QUEUE_ATTRIBUTES:
            attributes[key] = json.dumps(value) if isinstance(value, dict) else str(value)
        elif isinstance(value, bool):
            attributes[key] = "true" if value else "false"
        else:
            attributes[key] = str(value)
    return attributes


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def create_resources(template: Template, sqs: Any, dynamodb: Any) -> LocalResources:
    """Create every queue and table of ``template`` and describe its functions."""
    resolver = _Resolver(template, sqs, dynamodb)
    for logical_id in template.resources_of_type(QUEUE):
        resolver.queue(logical_id)
    for logical_id in template.resources_of_type(TABLE):
        resolver.table(logical_id)
    functions = {
        logical_id: resolver.function(logical_id)
        for kind in FUNCTIONS
        for logical_id in template.resources_of_type(kind)
    }
    return LocalResources(template.stack_name, dict(resolver.queues), dict(resolver.tables), functions)
