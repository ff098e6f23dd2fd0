"""An endpoint's setting (``ApiUrl``) is known by its type and its parameter's pattern, never by its name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from consumer.config import URL_PATTERN, ApiUrl, HandlerSettings, is_api_url
from local.stack import webhook_parameters
from testkit.template import url_parameters
from testkit.webhook import WebhookSink
from tests.deployment.lookups import endpoint_mistakes


class CarrierSettings(HandlerSettings):
    carrier_api_url: ApiUrl = ""  # CARRIER_API_URL
    carrier_timeout_ms: int = 3_000


def _template(pattern: str | None, variable: Any = None) -> dict[str, Any]:
    parameter: dict[str, Any] = {"Type": "String", "Default": ""}
    if pattern is not None:
        parameter["AllowedPattern"] = pattern
    variables = {"CARRIER_API_URL": {"Ref": "CarrierApiUrl"} if variable is None else variable}
    function = {"Type": "AWS::Serverless::Function", "Properties": {"Environment": {"Variables": variables}}}
    return {
        "Parameters": {"CarrierApiUrl": parameter, "Region": {"Type": "String", "AllowedPattern": r"^[a-z0-9-]+$"}},
        "Resources": {"ConsumerFunction": function},
    }


def test_an_api_url_setting_is_marked_and_takes_an_http_url_or_nothing() -> None:
    assert is_api_url(CarrierSettings, "carrier_api_url")
    assert not is_api_url(CarrierSettings, "carrier_timeout_ms")
    assert CarrierSettings(carrier_api_url="https://carrier.example.com/labels").carrier_api_url
    assert CarrierSettings(carrier_api_url="").carrier_api_url == ""
    with pytest.raises(ValidationError, match="String should match pattern"):
        CarrierSettings(carrier_api_url="carrier.example.com")


def test_a_url_parameter_is_known_by_its_pattern_whatever_its_name() -> None:
    assert url_parameters(_template(URL_PATTERN)) == ["CarrierApiUrl"]
    assert url_parameters(_template(r"^https://\S+$")) == []
    assert url_parameters(_template(None)) == []


def test_the_local_stack_points_a_url_parameter_of_any_name_at_its_sink(tmp_path: Path) -> None:
    path = tmp_path / "template.yaml"
    path.write_text(yaml.safe_dump(_template(URL_PATTERN)), encoding="utf-8")
    with WebhookSink() as sink:
        assert webhook_parameters(sink, path) == {"CarrierApiUrl": f"{sink.url}/CarrierApiUrl"}


def test_an_endpoint_setting_fed_by_a_parameter_of_the_right_pattern_is_no_mistake() -> None:
    assert endpoint_mistakes(_template(URL_PATTERN), [CarrierSettings]) == []


@pytest.mark.parametrize(
    ("pattern", "variable"),
    [(r"^https://\S+$", None), (None, None), (URL_PATTERN, "https://carrier.example.com")],
    ids=["another-pattern", "no-pattern", "a-literal"],
)
def test_an_endpoint_setting_the_sink_cannot_reach_is_one_failure_saying_what_to_give_it(
    pattern: str | None, variable: Any
) -> None:
    (mistake,) = endpoint_mistakes(_template(pattern, variable), [CarrierSettings])

    assert mistake.startswith("CARRIER_API_URL (CarrierSettings.carrier_api_url) is an ApiUrl")
    assert f"AllowedPattern is {URL_PATTERN}" in mistake
