"""Stack outputs, and samconfig.toml agreeing with what the template needs."""

from __future__ import annotations

import json
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
    "OutboxTableName": ResourceRef("OutboxTable"),
    "RelayFunctionName": ResourceRef("RelayFunction"),
    "RelayDeadLetterQueueUrl": ResourceRef("RelayDeadLetterQueue"),
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


def test_a_parameter_without_a_value_is_told_where_to_give_one_a_tables_by_its_keys(tmp_path: Path) -> None:
    template = tmp_path / "template.yaml"
    parameters = {"ExistingOrdersTable": {"Type": "String"}, "BillingUrl": {"Type": "String"}}
    for name, where in [
        ("ExistingOrdersTable", "OrdersTable's keys under LocalTables:"),
        ("BillingUrl", "LocalParameters"),
    ]:
        template.write_text(json.dumps({"Parameters": {name: parameters[name]}, "Resources": {}}), encoding="utf-8")
        said = str(parameter_mistake(template))
        assert f"parameter {name} has no Default: for make test and the local stack, add" in said
        assert where in said


def _samconfig() -> dict[str, Any]:
    return tomllib.loads(SAMCONFIG_PATH.read_text(encoding="utf-8"))


def _deploy_setting(name: str) -> Any:
    default = _samconfig()["default"]
    return default.get("deploy", {}).get("parameters", {}).get(name, default["global"]["parameters"].get(name))


def test_outputs_name_the_stack_resources(transformed_template: dict[str, Any], resolver: Template) -> None:
    outputs = {name: resolver.resolve(output["Value"]) for name, output in transformed_template["Outputs"].items()}
    assert {name: outputs.get(name) for name in REQUIRED_OUTPUTS} == REQUIRED_OUTPUTS


def shared_names(document: dict[str, Any]) -> list[str]:
    """Each name two of the template's sections give (a parameter and an output named alike, e.g. a table's
    ``<LogicalId>Name`` output beside a parameter of that name): CloudFormation wants each logical id unique within a
    template, and cfn-lint does not say so."""
    sections = ("Parameters", "Resources", "Outputs")
    names = {section: set(document.get(section) or {}) for section in sections}
    return [
        f"{name} is both one of the {first} and one of the {second}: rename one of them"
        for index, first in enumerate(sections)
        for second in sections[index + 1 :]
        for name in sorted(names[first] & names[second])
    ]


def test_no_two_sections_share_a_name(source_template: dict[str, Any]) -> None:
    assert shared_names(source_template) == []


def test_a_parameter_named_as_an_output_is_named() -> None:
    document: dict[str, Any] = {
        "Parameters": {"OrdersTableName": {}},
        "Resources": {},
        "Outputs": {"OrdersTableName": {}},
    }
    assert shared_names(document) == [
        "OrdersTableName is both one of the Parameters and one of the Outputs: rename one of them"
    ]


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
