"""Settings from the environment, and the lease they produce."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from pydantic import PositiveInt

from consumer.api import HandlerSettings, SecretArn
from consumer.config import Settings, is_secret_arn, table_variable
from consumer.errors import ConfigurationError
from consumer.handler import declared_settings
from consumer.idempotency.lease import lease_duration
from service.registry import HANDLERS
from testkit.template import LOCAL_PARAMETERS
from tests import kit
from tests.core.handlers import TallyHandler

REQUIRED = {"IDEMPOTENCY_TABLE_NAME": "i", "ORDERS_TABLE_NAME": "o", "DEAD_LETTER_QUEUE_URL": "https://q"}
TABLES = ("OrdersTable",)


def test_defaults_apply_when_only_the_required_variables_are_set() -> None:
    settings = Settings.from_env(REQUIRED, tables=TABLES)

    assert settings.idempotency_table_name == "i"
    assert settings.idempotency_ttl_seconds == 7 * 24 * 3600
    assert settings.handler_variables == {}


def test_tuning_variables_override_the_defaults() -> None:
    settings = Settings.from_env({**REQUIRED, "IDEMPOTENCY_TTL_SECONDS": "3600", "MAX_WORKERS": "4"}, tables=TABLES)

    assert settings.idempotency_ttl_seconds == 3600
    assert settings.max_workers == 4


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_a_missing_required_variable_is_named_in_the_error(missing: str) -> None:
    env = {name: value for name, value in REQUIRED.items() if name != missing}

    with pytest.raises(ConfigurationError, match=missing):
        Settings.from_env(env, tables=TABLES)


@pytest.mark.parametrize(
    ("raw", "message"), [("ten", "valid integer"), ("0", "greater than 0"), ("-5", "greater than 0"), ("1.5", "")]
)
def test_an_invalid_number_is_refused_with_its_name(raw: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=f"IDEMPOTENCY_TTL_SECONDS .*{message}"):
        Settings.from_env({**REQUIRED, "IDEMPOTENCY_TTL_SECONDS": raw}, tables=TABLES)


def test_an_unknown_setting_name_cannot_slip_in_through_the_model() -> None:
    with pytest.raises(ValueError, match="lease_max"):
        Settings.model_validate({"idempotency_table_name": "i", "dead_letter_queue_url": "q", "lease_max": 5})


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"LEASE_MIN_MS": "5000", "LEASE_MAX_MS": "1000"}, "LEASE_MIN_MS must not exceed LEASE_MAX_MS"),
        ({"LEASE_MARGIN_MS": "3001", "DEADLINE_MARGIN_MS": "3000"}, "LEASE_MARGIN_MS must not exceed DEADLINE_MARGIN"),
        ({"RETRY_BACKOFF_BASE_SECONDS": "600"}, "RETRY_BACKOFF_BASE_SECONDS must not exceed RETRY_BACKOFF_MAX"),
        ({"CONFLICT_RETRY_BASE_MS": "500"}, "CONFLICT_RETRY_BASE_MS must not exceed CONFLICT_RETRY_MAX_MS"),
    ],
)
def test_settings_that_cannot_work_together_are_refused_with_their_names(overrides: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        Settings.from_env({**REQUIRED, **overrides}, tables=TABLES)


@pytest.mark.parametrize(("ttl_s", "lease_max_ms"), [("900", "900000"), ("60", "900000"), ("1", "1001")])
def test_a_record_ttl_that_does_not_outlive_the_longest_lease_is_refused_naming_both(
    ttl_s: str, lease_max_ms: str
) -> None:
    # A record that expired under its owner's lease counts as absent: a duplicate would be applied meanwhile.
    env = {**REQUIRED, "IDEMPOTENCY_TTL_SECONDS": ttl_s, "LEASE_MAX_MS": lease_max_ms}
    with pytest.raises(
        ConfigurationError,
        match=f"IDEMPOTENCY_TTL_SECONDS={ttl_s} must outlive LEASE_MAX_MS={lease_max_ms}",
    ):
        Settings.from_env(env, tables=TABLES)


def test_a_record_ttl_just_past_the_longest_lease_is_accepted() -> None:
    env = {**REQUIRED, "IDEMPOTENCY_TTL_SECONDS": "901", "LEASE_MAX_MS": "900000"}
    assert Settings.from_env(env, tables=TABLES).idempotency_ttl_seconds == 901


def test_the_defaults_satisfy_every_cross_field_rule() -> None:
    settings = Settings.from_env(REQUIRED, tables=TABLES)

    assert settings.lease_min_ms <= settings.lease_max_ms
    assert settings.lease_margin_ms <= settings.deadline_margin_ms


@pytest.mark.parametrize(
    ("remaining_ms", "expected"),
    [
        (30_000, 28_000),  # remaining time less the margin
        (0, 1_000),  # no time left is never "no lease"
        (-50, 1_000),
        (2_500, 1_000),  # margin would leave 500 ms: the floor wins
        (3_600_000, 900_000),  # capped
    ],
)
def test_the_lease_follows_the_remaining_time_within_bounds(remaining_ms: int, expected: int) -> None:
    assert lease_duration(remaining_ms, margin_ms=2_000, min_ms=1_000, max_ms=900_000) == expected


def test_a_lease_floor_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="min_ms"):
        lease_duration(30_000, margin_ms=0, min_ms=0, max_ms=1_000)


def test_each_declared_table_is_read_from_the_variable_named_after_it() -> None:
    settings = Settings.from_env(
        {**REQUIRED, "INVENTORY_TABLE_NAME": "inv-1"}, tables=("OrdersTable", "InventoryTable")
    )

    assert settings.table_names == {"OrdersTable": "o", "InventoryTable": "inv-1"}
    assert table_variable("IdempotencyTable") == "IDEMPOTENCY_TABLE_NAME"
    assert table_variable("SKU2Table") == "SKU2_TABLE_NAME"


def test_a_declared_table_without_its_variable_is_named_with_the_table() -> None:
    # A mistyped variable in the template leaves the one the handler's table needs unset.
    env = {**REQUIRED, "INVENTRY_TABLE_NAME": "inv-1"}

    with pytest.raises(ConfigurationError, match=r"INVENTORY_TABLE_NAME \(table InventoryTable\)"):
        Settings.from_env(env, tables=("OrdersTable", "InventoryTable"))


class BillingSettings(HandlerSettings):
    """A handler's own settings, as docs/settings.md ("A setting of your own") shows them."""

    billing_url: str
    billing_timeout_ms: PositiveInt = 3_000
    billing_secret_arn: SecretArn = ""


ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:billing-AbCdEf"


def test_a_handlers_own_settings_are_read_from_their_upper_case_variables() -> None:
    env = {**REQUIRED, "BILLING_URL": " https://billing.example.com/charge ", "BILLING_SECRET_ARN": ARN}

    settings = Settings.from_env(env, tables=TABLES, handler_settings=(BillingSettings,))

    own = settings.of(BillingSettings)
    assert (own.billing_url, own.billing_timeout_ms, own.billing_secret_arn) == (
        "https://billing.example.com/charge",
        3_000,
        ARN,
    )
    # Carried as the variables, so the settings survive a JSON round trip (the chaos run's workers).
    assert Settings.model_validate_json(settings.model_dump_json()).of(BillingSettings) == own


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({}, "environment variable BILLING_URL is required"),
        ({"BILLING_URL": "u", "BILLING_TIMEOUT_MS": "soon"}, "BILLING_TIMEOUT_MS Input should be a valid integer"),
        ({"BILLING_URL": "u", "BILLING_TIMEOUT_MS": "0"}, "BILLING_TIMEOUT_MS Input should be greater than 0"),
        ({"BILLING_URL": "u", "BILLING_SECRET_ARN": "billing"}, "BILLING_SECRET_ARN String should match"),
    ],
)
def test_a_missing_or_bad_handler_setting_is_refused_at_start_with_its_variable(
    variables: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named):
        Settings.from_env({**REQUIRED, **variables}, tables=TABLES, handler_settings=(BillingSettings,))


def test_a_secret_arn_setting_is_marked_for_the_templates_grant() -> None:
    assert is_secret_arn(BillingSettings, "billing_secret_arn")
    assert not is_secret_arn(BillingSettings, "billing_url")


def test_the_cores_settings_name_no_handlers_setting() -> None:
    """A handler's setting goes with the handler: removing it leaves nothing of it in consumer.config."""
    tree = ast.parse((Path(__file__).resolve().parents[2] / "src" / "consumer" / "config.py").read_text("utf-8"))
    # Its code, not its docstrings: one may take the docs' example (``billing_url``) to explain a handler's settings.
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) and ast.get_docstring(node) is not None:
            node.body[0] = ast.Pass()
    code = ast.unparse(tree)
    for model in declared_settings(HANDLERS):
        for name in model.model_fields:
            assert name not in Settings.model_fields
            assert name not in code and name.upper() not in code, (model.__name__, name)


class BilledTally(TallyHandler):
    """A handler whose own settings have a required one (BillingSettings' ``billing_url``)."""

    settings_model: ClassVar[type[HandlerSettings]] = BillingSettings


def _with_billing_url(tmp_path: Path, local_value: str | None) -> Path:
    """A template of its own (whatever template.yaml holds): docs/settings.md's BillingUrl parameter (no
    Default) and its variable, and ``local_value`` (if any) under the Metadata's LocalParameters."""
    function: dict[str, Any] = {"Type": "AWS::Serverless::Function", "Properties": {"Environment": {"Variables": {}}}}
    document: dict[str, Any] = {"Metadata": {}, "Parameters": {}, "Resources": {"ConsumerFunction": function}}
    if local_value is not None:
        document["Parameters"]["BillingUrl"] = {"Type": "String", "AllowedPattern": r"^https://\S+$"}
        document["Metadata"][LOCAL_PARAMETERS] = {"BillingUrl": local_value}
        function["Properties"]["Environment"]["Variables"]["BILLING_URL"] = {"Ref": "BillingUrl"}
    path = tmp_path / "template.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def test_the_kit_gives_a_required_setting_left_out_the_value_the_template_gives_its_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kit, "TEMPLATE_PATH", _with_billing_url(tmp_path, "https://billing.example.com"))

    assert kit.settings_for([BilledTally]).of(BillingSettings).billing_url == "https://billing.example.com"
    # A value the test gives wins.
    given = kit.settings_for([BilledTally], billing_url="https://other.example.com")
    assert given.of(BillingSettings).billing_url == "https://other.example.com"


def test_a_required_setting_with_no_value_anywhere_names_the_line_to_add(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kit, "TEMPLATE_PATH", _with_billing_url(tmp_path, None))

    with pytest.raises(kit.NoTestValue, match=r'"BILLING_URL: !Ref <its parameter>".* or pass it here: billing_url='):
        kit.settings_for([BilledTally])
