"""The Lambda entry point's maker: the consumer of the handlers an application registers.

An application's entry module is a few lines (``src/service/lambda_function.py``)::

    from consumer import lambda_handler
    from service.registry import HANDLERS

    handler = lambda_handler(HANDLERS)

The assembly is ``consumer.wiring``; all logic lives in ``consumer.batch`` (the batch),
``consumer.processor`` (one message) and ``consumer.idempotency`` (the state machine). Endpoints
come from boto3's own ``AWS_ENDPOINT_URL*`` variables: there is no local code path.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Any

import botocore.session
from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from consumer.batch import BatchRunner
from consumer.config import Settings
from consumer.errors import ConfigurationError
from consumer.handler import Handlers, build_handlers, declared_settings, declared_tables
from consumer.idempotency.observer import FallBack
from consumer.outcome import Outcome
from consumer.sdk import require_botocore
from consumer.wiring import logger, wire

__all__ = ["LambdaHandler", "lambda_handler", "logger", "metrics", "wire"]

metrics = Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "IdempotentConsumer"))

Response = dict[str, list[dict[str, str]]]


class LambdaHandler:
    """The function's handler for one set of handlers: ``handler(event, context)``, as Lambda calls it."""

    def __init__(self, handlers: Handlers) -> None:
        self.handlers = tuple(handlers)
        self._consumer: BatchRunner | None = None
        self._entry: Callable[[object, LambdaContext], Response] = metrics.log_metrics(
            logger.inject_lambda_context(clear_state=True)(self._handle)
        )

    def build_consumer(self) -> BatchRunner:
        """The consumer of this container, built once after its checks (in Lambda, during init).

        Settings, the runtime's SDK and the tables are checked first, so a misconfigured
        function fails its first invocation with the cause named, before any message is touched.
        """
        # Lambda's runtime calls a handler one invocation at a time: no lock, as the lru_cache before it had none.
        if self._consumer is None:
            settings = Settings.from_env(
                tables=declared_tables(self.handlers), handler_settings=declared_settings(self.handlers)
            )
            session = botocore.session.get_session()
            require_botocore(session)
            if settings.tracing:
                from consumer.tracing import trace_calls  # noqa: PLC0415 (only here: off, nothing of it is imported)

                trace_calls(session)
            self._consumer = wire(
                settings, session, handlers=build_handlers(self.handlers, settings), check_tables=True
            )
        return self._consumer

    @property
    def built(self) -> bool:
        """Whether the consumer is built: in Lambda's runtime, during init, unless a check failed."""
        return self._consumer is not None

    def __call__(self, event: object, context: Any) -> Response:
        # Any: Lambda passes its runtime's context object, tests and tools their own of the same shape.
        return self._entry(event, context)

    def _handle(self, event: object, context: LambdaContext) -> Response:
        consumer = self.build_consumer()
        messages = event.get("Records") if isinstance(event, Mapping) else None
        batch = consumer.process(messages, context.get_remaining_time_in_millis)
        counts = batch.counts()
        for outcome in Outcome:
            metrics.add_metric(name=outcome.value, unit=MetricUnit.Count, value=counts.get(outcome, 0))
        grouping = batch.grouping
        metrics.add_metric(name="conflicts_absorbed", unit=MetricUnit.Count, value=grouping.conflicts_absorbed)
        # Whether and how well the batch was grouped: an operator tells group commit from its absence by these.
        metrics.add_metric(name="transactions", unit=MetricUnit.Count, value=grouping.transactions)
        metrics.add_metric(
            name="messages_per_transaction", unit=MetricUnit.Count, value=grouping.messages_per_transaction
        )
        for reason in FallBack.ALL:
            metrics.add_metric(
                name=f"fell_back_{reason}", unit=MetricUnit.Count, value=grouping.fell_back.get(reason, 0)
            )
        response = batch.response()
        logger.info(
            "batch done",
            extra={
                "messages": len(batch.results),
                "failures": len(response["batchItemFailures"]),
                **grouping.log_keys(),
                **{outcome.value: counts.get(outcome, 0) for outcome in Outcome},
            },
        )
        return response


def lambda_handler(handlers: Handlers) -> LambdaHandler:
    """The Lambda handler that consumes SQS batches with ``handlers``, each applied exactly once.

    Parameters
    ----------
    handlers
        The application's ``MessageHandler`` classes, one per ``eventType``; each is built from the
        settings read at start (``Settings.from_env``, its own ``settings_model`` included).

    Returns
    -------
    LambdaHandler
        Callable as ``handler(event, context)``: an SQS event in, ``{"batchItemFailures": [...]}`` out.

    Examples
    --------
    In ``src/service/lambda_function.py``, named by ``Handler: service.lambda_function.handler``::

        handler = lambda_handler(HANDLERS)

    Limitations
    -----------
    In Lambda's runtime (``AWS_LAMBDA_FUNCTION_NAME`` set) the consumer is built here, during init,
    which Lambda runs on a full vCPU; a setting or SDK that fails its check is left to fail the first
    invocation with its cause. Elsewhere it is built on the first invocation.
    """
    function = LambdaHandler(handlers)
    if "AWS_LAMBDA_FUNCTION_NAME" in os.environ:
        with contextlib.suppress(ConfigurationError):
            function.build_consumer()
    return function
