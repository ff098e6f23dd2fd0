"""The template deployed on the local servers, its function ready in Lambda's own runtime: each poller invokes an
execution environment of its own, as Lambda runs one per concurrent invocation."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, TextIO

from consumer.outbox import OUTBOX_TABLE
from local.poller import BatchReport, Poller, PollerGroup, PollerStats
from local.stream_poller import StreamPoller, StreamPollerStats
from testkit.invocation import Invoker
from testkit.lambda_runtime import LambdaEnvironment, LambdaFleet
from testkit.resources import LocalResources, QueueResource
from testkit.servers import LocalServers
from testkit.tables import count
from testkit.template import TEMPLATE_PATH, load_template, secret_parameters, url_parameters
from testkit.webhook import WebhookSink


class DeployedStack:
    """The template deployed, built by ``deploy_stack``."""

    def __init__(self, servers: LocalServers, resources: LocalResources, fleet: LambdaFleet) -> None:
        self.servers = servers
        self.resources = resources
        self.fleet = fleet
        self.function = fleet.function
        self.trigger = self.function.triggers[0]
        self.queue: QueueResource = resources.queues[self.trigger.queue_logical_id]
        self.stats = PollerStats()
        self._sqs = servers.client("sqs", max_pool_connections=50, timeout_s=30.0)
        self._groups: list[PollerGroup] = []
        self.relay_stats = StreamPollerStats()

    @property
    def dead_letter_queue(self) -> QueueResource:
        return self.resources.dead_letter_queue(self.queue)

    def table_name(self, logical_id: str) -> str:
        return self.resources.tables[logical_id].name

    def poller(self, on_batch: Callable[[BatchReport], None] | None = None) -> Poller:
        def record(report: BatchReport) -> None:
            self.stats.add(report)
            if on_batch is not None:
                on_batch(report)

        return Poller(self._sqs, self.queue, self.trigger, self.fleet.add(), on_batch=record)

    def pollers(self, count: int, on_batch: Callable[[BatchReport], None] | None = None) -> PollerGroup:
        """``count`` pollers running in threads; stopped with the stack, or by ``stop()`` on the group."""
        group = PollerGroup([self.poller(on_batch) for _ in range(count)]).start()
        self._groups.append(group)
        return group

    @cached_property
    def relay_fleet(self) -> LambdaFleet:
        """The relay's execution environments: the template's function that a stream feeds."""
        (relay,) = [function for function in self.resources.functions.values() if function.streams]
        return LambdaFleet(relay, self.servers.function_environment(relay), log_sink=self.fleet.log_sink)

    def relay_poller(self, runtime: Invoker | None = None) -> StreamPoller:
        """The relay's stream mapping, invoking ``runtime`` (an environment of the relay's own unless given)."""
        trigger = self.relay_fleet.function.streams[0]
        streams = self.servers.client("dynamodbstreams")
        return StreamPoller(streams, self._sqs, trigger, runtime or self.relay_fleet.add(), stats=self.relay_stats)

    def outbox_items(self) -> int:
        """How many items the outbox holds (each one record of its stream)."""
        return count(self.servers.client("dynamodb"), self.table_name(OUTBOX_TABLE))

    def relays(self) -> PollerGroup:
        """The relay fed by the outbox's stream, as Lambda's mapping feeds it (one invocation at a time per shard);
        stopped with the stack, or by ``stop()`` on the group."""
        group = PollerGroup([self.relay_poller()]).start()
        self._groups.append(group)
        return group

    @cached_property
    def runtime(self) -> LambdaEnvironment:
        """An execution environment for direct invocations, apart from the pollers'."""
        return self.fleet.add()

    @property
    def function_environment(self) -> dict[str, str]:
        return self.fleet.environment

    def stop(self) -> None:
        for group in self._groups:
            group.stop()
        self._groups.clear()
        self.fleet.stop()
        if "relay_fleet" in self.__dict__:
            self.relay_fleet.stop()


def webhook_parameters(webhook: WebhookSink, template_path: Path = TEMPLATE_PATH) -> dict[str, str]:
    """Each endpoint's parameter the template has (``ApiUrl``'s pattern, any name; none once its handlers are gone),
    at ``<sink>/<its name>``."""
    return {name: f"{webhook.url}/{name}" for name in url_parameters(load_template(template_path))}


def deploy_stack(
    servers: LocalServers,
    *,
    template_path: Path = TEMPLATE_PATH,
    stack_name: str | None = None,
    parameter_overrides: Mapping[str, Any] | None = None,
    webhook: WebhookSink | None = None,
    memory_mb: int | None = None,
    log_sink: TextIO | None = None,
) -> DeployedStack:
    """Create the template's resources and make its function ready against them. With a ``webhook`` sink, its
    ``webhook_parameters`` and each parameter of SecretArn's pattern (any name) at a secret holding the sink's, unless
    overridden; ``memory_mb`` overrides ``MemorySize`` (and with it the CPU share)."""
    overrides = {**(webhook_parameters(webhook, template_path) if webhook else {}), **(parameter_overrides or {})}
    if webhook is not None:
        for name in [name for name in secret_parameters(load_template(template_path)) if name not in overrides]:
            secret = servers.client("secretsmanager").create_secret(Name=uuid.uuid4().hex, SecretString=webhook.secret)
            overrides[name] = secret["ARN"]
    resources = servers.deploy(template_path, stack_name=stack_name, parameter_overrides=overrides)
    function = resources.function()
    fleet = LambdaFleet(function, servers.function_environment(function), memory_mb=memory_mb, log_sink=log_sink)
    return DeployedStack(servers, resources, fleet)
