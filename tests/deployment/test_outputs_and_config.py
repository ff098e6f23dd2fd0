"""Stack outputs, and samconfig.toml agreeing with what the template needs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from testkit.template import ResourceRef, Template
from tests.deployment.conftest import parameter_mistake
from tests.deployment.lookups import SAMCONFIG_PATH, SQS_QUEUE_NAME, properties

# Output -> what it must evaluate to. Scripts and the docs read these names.
REQUIRED_OUTPUTS = {
    "ConsumerQueueUrl": ResourceRef("ConsumerQueue"),
    "DeadLetterQueueUrl": ResourceRef("ConsumerDeadLetterQueue"),
    "IdempotencyTableName": ResourceRef("IdempotencyTable"),
    "ConsumerFunctionName": ResourceRef("ConsumerFunction"),
}
# Properties that give an IAM resource a fixed name, which CloudFormation accepts only with CAPABILITY_NAMED_IAM.
IAM_NAME_PROPERTIES = {
    "AWS::IAM::Role": "RoleName",
    "AWS::IAM::ManagedPolicy": "ManagedPolicyName",
    "AWS::IAM::User": "UserName",
    "AWS::IAM::Group": "GroupName",
    "AWS::IAM::InstanceProfile": "InstanceProfileName",
}
STACK_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,127}")


def test_every_parameter_has_a_value_for_the_checks(template_path: Path) -> None:
    # A Default, or for make test and the local stack a value under the template's Metadata (LocalParameters).
    mistake = parameter_mistake(template_path)
    if mistake:
        pytest.fail(f"{template_path}: {mistake}", pytrace=False)


def _samconfig() -> dict[str, Any]:
    return tomllib.loads(SAMCONFIG_PATH.read_text(encoding="utf-8"))


def _deploy_setting(name: str) -> Any:
    default = _samconfig()["default"]
    return default.get("deploy", {}).get("parameters", {}).get(name, default["global"]["parameters"].get(name))


def test_outputs_name_the_stack_resources(transformed_template: dict[str, Any], resolver: Template) -> None:
    outputs = {name: resolver.resolve(output["Value"]) for name, output in transformed_template["Outputs"].items()}
    assert {name: outputs.get(name) for name in REQUIRED_OUTPUTS} == REQUIRED_OUTPUTS


def test_samconfig_acknowledges_the_capabilities_the_template_needs(transformed_template: dict[str, Any]) -> None:
    capabilities = set(str(_deploy_setting("capabilities")).split())
    iam_resources = {
        name: body for name, body in transformed_template["Resources"].items() if body["Type"].startswith("AWS::IAM::")
    }
    named = [
        name for name, body in iam_resources.items() if IAM_NAME_PROPERTIES.get(body["Type"]) in body["Properties"]
    ]
    if named:
        assert "CAPABILITY_NAMED_IAM" in capabilities, named
    elif iam_resources:
        assert capabilities & {"CAPABILITY_IAM", "CAPABILITY_NAMED_IAM"}


@pytest.mark.parametrize("queue_type", ["standard", "fifo"])
def test_samconfig_stack_name_gives_a_valid_queue_name(transformed_template: dict[str, Any], queue_type: str) -> None:
    # The consumer queue is named after the stack (for the dead-letter queue's redrive allow policy).
    stack_name = _deploy_setting("stack_name")
    assert STACK_NAME.fullmatch(stack_name)
    reading = Template(transformed_template, stack_name=stack_name, parameter_overrides={"QueueType": queue_type})
    queue_name = reading.resolve(properties(transformed_template, "ConsumerQueue")["QueueName"])
    assert SQS_QUEUE_NAME.fullmatch(queue_name), queue_name
    allowed_sources = reading.resolve(properties(transformed_template, "ConsumerDeadLetterQueue")["RedriveAllowPolicy"])
    assert allowed_sources["sourceQueueArns"][0].endswith(f":{queue_name}")


def test_samconfig_deploys_through_a_reviewed_change_set_with_a_managed_bucket() -> None:
    assert _samconfig()["version"] == 0.1
    assert _deploy_setting("confirm_changeset") is True
    assert _deploy_setting("resolve_s3") is True
