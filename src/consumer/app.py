"""Lambda entry point: the consumer built once per container, then the handler.

Handler: ``consumer.app.handler``. The assembly is ``consumer.wiring``; all logic lives in
``consumer.batch`` (the batch), ``consumer.processor`` (one message) and
``consumer.idempotency`` (the state machine). Endpoints come from boto3's own
``AWS_ENDPOINT_URL*`` variables: there is no local code path.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from functools import lru_cache

import botocore.session
from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from consumer.batch import BatchRunner
from consumer.config import Settings
from consumer.errors import ConfigurationError
from consumer.handlers import declared_settings, declared_tables
from consumer.outcome import Outcome
from consumer.sdk import require_botocore
from consumer.wiring import logger, wire

__all__ = ["build_consumer", "handler", "logger", "metrics", "wire"]

metrics = Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "IdempotentConsumer"))


@lru_cache(maxsize=1)
def build_consumer() -> BatchRunner:
    """The consumer of this container, built once after its checks (in Lambda, during init).

    Settings, the runtime's SDK and the tables are checked first, so a misconfigured
    function fails its first invocation with the cause named, before any message is touched.
    """
    settings = Settings.from_env(tables=declared_tables(), handler_settings=declared_settings())
    session = botocore.session.get_session()
    require_botocore(session)
    return wire(settings, session, check_tables=True)


# Lambda runs an on-demand function's init phase on a full vCPU and its invocations at the memory
# size's share (bench/methodology.md): in Lambda's runtime the consumer is built during init. A
# setting or SDK that fails its check is left to fail the first invocation with its cause, as it
# does without this; code that imports this module elsewhere builds the consumer when it means to.
if "AWS_LAMBDA_FUNCTION_NAME" in os.environ:
    with contextlib.suppress(ConfigurationError):
        build_consumer()


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def handler(event: object, context: LambdaContext) -> dict[str, list[dict[str, str]]]:
    consumer = build_consumer()
    messages = event.get("Records") if isinstance(event, Mapping) else None
    batch = consumer.process(messages, context.get_remaining_time_in_millis)
    counts = batch.counts()
    for outcome in Outcome:
        metrics.add_metric(name=outcome.value, unit=MetricUnit.Count, value=counts.get(outcome, 0))
    absorbed = batch.conflicts_absorbed()
    metrics.add_metric(name="conflicts_absorbed", unit=MetricUnit.Count, value=absorbed)
    response = batch.response()
    logger.info(
        "batch done",
        extra={
            "messages": len(batch.results),
            "failures": len(response["batchItemFailures"]),
            "conflicts_absorbed": absorbed,
            **{outcome.value: counts.get(outcome, 0) for outcome in Outcome},
        },
    )
    return response
