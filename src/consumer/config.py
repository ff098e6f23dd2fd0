"""Settings read once per container from the function's environment, validated as a whole.

Each field is read from the variable of the same name in upper case
(``lease_max_ms`` from ``LEASE_MAX_MS``), each table a handler declares from the
variable ``table_variable`` names (``OrdersTable`` from ``ORDERS_TABLE_NAME``), and each
handler's own settings (``MessageHandler.settings_model``, a ``HandlerSettings``) the same
way. Rules that tie several fields together are checked here, at the first invocation,
before any message is touched: a setting that could only fail per message would send every
message of that kind to the DLQ instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, model_validator

from consumer.errors import ConfigurationError

ModelT = TypeVar("ModelT", bound=BaseModel)


def _variable(logical_id: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", logical_id).upper()


def table_variable(logical_id: str) -> str:
    """The variable that carries a template table's name: OrdersTable -> ORDERS_TABLE_NAME."""
    return _variable(logical_id) + "_NAME"


def destination_variable(logical_id: str) -> str:
    """The variable that carries a destination's address to the relay (a queue's URL, a topic's ARN, a bus's name):
    ReceiptQueue -> RECEIPT_QUEUE_DESTINATION."""
    return _variable(logical_id) + "_DESTINATION"


# How a template parameter that names an existing table starts. Outputs are named after what they give
# (``<LogicalId><Attribute>``, e.g. the table's ``OrdersTableName``), and CloudFormation wants each logical id unique
# within a template: the parameter must never be named as the output of its table is.
_EXISTING = "Existing"


def table_parameter(logical_id: str) -> str:
    """The template parameter that names an existing table instead of a resource: OrdersTable -> ExistingOrdersTable."""
    return f"{_EXISTING}{logical_id}"


def parameter_table(parameter: str) -> str | None:
    """The table a parameter names by ``table_parameter``'s rule (ExistingOrdersTable -> OrdersTable), or None."""
    table = parameter.removeprefix(_EXISTING)
    return table if table and table != parameter else None


class HandlerSettings(BaseModel):
    """Settings a handler declares as its own (``MessageHandler.settings_model``): each field is read
    from its upper-case variable at start (``billing_url`` from ``BILLING_URL``); a field without a
    default is required. The handler reads them with ``settings.of(its model)``."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class _SecretArnMarker:
    """Marks a setting that names a Secrets Manager secret: the role must be able to read it."""


# A handler setting that names a secret: empty, or the ARN the template's grant and variable carry.
SecretArn = Annotated[
    str, Field(pattern=r"^(arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:\S+)?$"), _SecretArnMarker()
]


def is_secret_arn(model: type[BaseModel], field: str) -> bool:
    return any(isinstance(meta, _SecretArnMarker) for meta in model.model_fields[field].metadata)


class _ApiUrlMarker:
    """Marks a setting that names an HTTP endpoint a handler calls: locally, it is pointed at the webhook sink."""


# The pattern of an endpoint's setting and of its template parameter (``AllowedPattern``): empty, or an http(s) URL
# (``WebhookClient`` refuses http beyond loopback at start). The parameter is known by it, whatever its name.
URL_PATTERN = r"^(https?://\S+)?$"

# A handler setting that names an HTTP endpoint it calls: the local stack and the generic contract point its
# parameter at their webhook sink, whatever the setting and the parameter are called.
ApiUrl = Annotated[str, Field(pattern=URL_PATTERN), _ApiUrlMarker()]


def is_api_url(model: type[BaseModel], field: str) -> bool:
    return any(isinstance(meta, _ApiUrlMarker) for meta in model.model_fields[field].metadata)


def read_settings(model: type[ModelT], env: Mapping[str, str], given: Mapping[str, object] | None = None) -> ModelT:
    """``model`` from ``env``, each field from its upper-case variable (but those ``given``); raise
    ``ConfigurationError`` naming each missing or bad variable."""
    values: dict[str, Any] = dict(given or {})
    for name, field in model.model_fields.items():
        raw = env.get(name.upper(), "").strip()
        if raw and name not in values:
            values[name] = raw
        elif field.is_required() and name not in values:
            raise ConfigurationError(f"environment variable {name.upper()} is required and is empty or unset")
    try:
        return model.model_validate(values)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in issue['loc']).upper() or 'settings'} {issue['msg']}"
            f" (got {issue['input']!r})"
            for issue in error.errors()
        )
        raise ConfigurationError(f"invalid configuration: {problems}") from None


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    idempotency_table_name: str = Field(min_length=1)
    dead_letter_queue_url: str = Field(min_length=1)
    # The deployed name of each table the handlers declare (``MessageHandler.tables``), by logical id.
    table_names: dict[str, str] = Field(default_factory=dict)
    # The variables the handlers' own settings read, as set (``of`` reads a handler's model from them).
    handler_variables: dict[str, str] = Field(default_factory=dict)
    # Must outlive every redelivery and producer resend you want caught: SQS keeps
    # messages up to 14 days, producers may resend later still.
    idempotency_ttl_seconds: PositiveInt = 7 * 24 * 3600
    # The lease is the invocation's remaining time minus this margin, capped below.
    lease_margin_ms: PositiveInt = 2_000
    lease_max_ms: PositiveInt = 15 * 60 * 1000
    # A lease is never shorter than this, even when the invocation is nearly out of
    # time: a zero lease would let a second worker take the key over at once.
    lease_min_ms: PositiveInt = 1_000
    # No new message is started with less than this left of the invocation.
    deadline_margin_ms: PositiveInt = 3_000
    max_workers: PositiveInt = 10
    # Results bigger than this are stored as a digest to stay far below the 400 KB item limit.
    result_max_bytes: PositiveInt = 64 * 1024
    # A transiently failed message comes back after base x 2^(receives - 1) seconds, capped.
    retry_backoff_base_seconds: PositiveInt = 2
    retry_backoff_max_seconds: PositiveInt = 300
    # A write refused by a transaction conflict is retried in process after a random
    # wait of up to base x 2^attempt ms (capped), while the message's time allows.
    conflict_retry_base_ms: PositiveInt = 5
    conflict_retry_max_ms: PositiveInt = 200
    # X-Ray subsegments for every call (consumer.tracing), under the segments of Lambda's active tracing.
    tracing: bool = False
    # Transitions of a batch's messages that are ready at the same moment (applies, claims, commits, releases) whose
    # items are disjoint share one transaction, each with its own outcome; false sends each message's alone.
    group_commit: bool = True
    # The longest a transition waits for others to share its transaction: far below any lease and the deadline.
    group_commit_wait_ms: PositiveInt = 20

    @model_validator(mode="after")
    def _fields_fit_together(self) -> Self:
        def refuse(low: str, high: str, why: str) -> ConfigurationError:
            values = f"{low.upper()}={getattr(self, low)}, {high.upper()}={getattr(self, high)}"
            return ConfigurationError(f"{low.upper()} must not exceed {high.upper()} ({values}): {why}")

        if self.lease_min_ms > self.lease_max_ms:
            raise refuse("lease_min_ms", "lease_max_ms", "no lease could satisfy both")
        if self.lease_margin_ms > self.deadline_margin_ms:
            # A message is started with as little as DEADLINE_MARGIN_MS left; its lease is that
            # less LEASE_MARGIN_MS, so the reverse would start messages with no time to work.
            raise refuse("lease_margin_ms", "deadline_margin_ms", "messages would start with no time under their lease")
        if self.retry_backoff_base_seconds > self.retry_backoff_max_seconds:
            raise refuse("retry_backoff_base_seconds", "retry_backoff_max_seconds", "the cap would undercut the base")
        if self.conflict_retry_base_ms > self.conflict_retry_max_ms:
            raise refuse("conflict_retry_base_ms", "conflict_retry_max_ms", "the cap would undercut the base")
        if self.group_commit_wait_ms * 10 > self.lease_min_ms:
            # A commit waiting for company must never eat into the lease that bounds its message.
            raise ConfigurationError(
                f"GROUP_COMMIT_WAIT_MS={self.group_commit_wait_ms} must be at most a tenth of"
                f" LEASE_MIN_MS={self.lease_min_ms}: a transition waits that long for others to share its transaction"
            )
        if self.idempotency_ttl_seconds * 1000 <= self.lease_max_ms:
            # A record expired under its owner's lease counts as absent: a duplicate would be applied meanwhile.
            raise ConfigurationError(
                f"IDEMPOTENCY_TTL_SECONDS={self.idempotency_ttl_seconds} must outlive LEASE_MAX_MS={self.lease_max_ms}"
                " (the longest lease): a record expiring under its owner's lease lets a duplicate run meanwhile"
            )
        return self

    def every_table(self) -> dict[str, str]:
        """Every table the function uses, by logical id: its idempotency table and the handlers' tables."""
        return {"IdempotencyTable": self.idempotency_table_name, **self.table_names}

    def of(self, model: type[ModelT]) -> ModelT:
        """A handler's own settings (its ``settings_model``), from the variables read at start."""
        return read_settings(model, self.handler_variables)

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        tables: Iterable[str] = (),
        handler_settings: Iterable[type[HandlerSettings]] = (),
    ) -> Settings:
        """Read and validate every setting, the name of each of ``tables`` (logical ids the handlers
        declare) and each of ``handler_settings`` (the models they declare); raise ``ConfigurationError``
        naming each bad variable."""
        env = os.environ if env is None else env
        names = {table: env.get(table_variable(table), "").strip() for table in tables}
        missing = [f"{table_variable(table)} (table {table})" for table, name in names.items() if not name]
        if missing:
            raise ConfigurationError(
                f"environment variable {', '.join(missing)} is required by a handler's tables and is empty or unset"
            )
        own: dict[str, str] = {}
        for model in handler_settings:
            read_settings(model, env)
            own |= {name.upper(): env[name.upper()] for name in model.model_fields if env.get(name.upper(), "").strip()}
        return read_settings(cls, env, given={"table_names": names, "handler_variables": own})
