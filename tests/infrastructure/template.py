"""template.yaml as CloudFormation sees it: transformed offline, intrinsics resolved from parameters.

The transform is SAM's own translator, run without AWS: the template grants no managed
policies, so the translator never needs IAM to look one up (it fails the test if it tries).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from samtranslator.public.parser import Parser
from samtranslator.public.translator import Translator
from samtranslator.yaml_helper import yaml_parse

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_PATH = REPO_ROOT / "template.yaml"
SAMCONFIG_PATH = REPO_ROOT / "samconfig.toml"

REGION = "us-east-1"
ACCOUNT_ID = "123456789012"
STACK_NAME = "idempotent-sqs-consumer"
# What Lambda's event source mapping does with the function's role: poll, delete, read attributes.
EVENT_SOURCE_POLLING = frozenset({"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"})
# What `sam package` puts in place of a local CodeUri before CloudFormation transforms the template.
PACKAGED_CODE_URI = "s3://packaged-artifacts/consumer.zip"

_SUB_VARIABLE = re.compile(r"\$\{([^}!][^}]*)\}")


def load_source_template() -> dict[str, Any]:
    """template.yaml as written (short-form intrinsics expanded to their long form)."""
    return yaml_parse(TEMPLATE_PATH.read_text(encoding="utf-8"))


def transform(source: Mapping[str, Any]) -> dict[str, Any]:
    """The CloudFormation template the AWS::Serverless transform produces from ``source``."""
    packaged = copy.deepcopy(dict(source))
    for resource in packaged["Resources"].values():
        if resource["Type"] == "AWS::Serverless::Function":
            resource["Properties"]["CodeUri"] = PACKAGED_CODE_URI
    translator = Translator({}, Parser(), boto_session=boto3.session.Session(region_name=REGION))
    return translator.translate(packaged, {}, get_managed_policy_map=_refuse_managed_policy_lookup)


def _refuse_managed_policy_lookup() -> dict[str, str]:
    raise AssertionError("the template refers to an AWS managed policy; it should grant explicit statements only")


def resources_of_type(template: Mapping[str, Any], resource_type: str) -> dict[str, dict[str, Any]]:
    return {name: body for name, body in template["Resources"].items() if body["Type"] == resource_type}


def properties(template: Mapping[str, Any], logical_id: str) -> dict[str, Any]:
    return template["Resources"][logical_id].get("Properties", {})


def event_source_mapping(template: Mapping[str, Any]) -> dict[str, Any]:
    """Properties of the stack's only event source mapping (the SQS event of the function)."""
    (mapping,) = resources_of_type(template, "AWS::Lambda::EventSourceMapping").values()
    return mapping["Properties"]


def parameter_name(expression: Any) -> str:
    """The parameter a property takes its value from; fails on a literal."""
    assert isinstance(expression, dict), f"expected a parameter reference, got the literal {expression!r}"
    assert set(expression) == {"Ref"}, f"expected a parameter reference, got {expression!r}"
    return expression["Ref"]


def parameter_candidates(template: Mapping[str, Any], name: str) -> list[Any]:
    """Every value a parameter can take, or its extremes and default when it is a range."""
    spec = template["Parameters"][name]
    if "AllowedValues" in spec:
        return list(spec["AllowedValues"])
    return sorted({spec[key] for key in ("MinValue", "Default", "MaxValue") if key in spec})


@dataclass(frozen=True)
class ResourceRef:
    """A reference to one of the stack's resources: ``Ref`` (attribute None) or ``Fn::GetAtt``."""

    logical_id: str
    attribute: str | None = None


class _NoValue:
    """``AWS::NoValue``: the property or list item is left out."""


NO_VALUE = _NoValue()


class Resolver:
    """Evaluate intrinsic functions for given parameter values; resources stay symbolic."""

    def __init__(
        self, template: Mapping[str, Any], overrides: Mapping[str, Any] | None = None, *, stack_name: str = STACK_NAME
    ) -> None:
        self._template = template
        overrides = overrides or {}
        unknown = set(overrides) - set(template.get("Parameters", {}))
        if unknown:
            raise KeyError(f"not parameters of the template: {sorted(unknown)}")
        self.parameters = {
            name: overrides.get(name, spec.get("Default")) for name, spec in template.get("Parameters", {}).items()
        }
        self._pseudo = {
            "AWS::Region": REGION,
            "AWS::AccountId": ACCOUNT_ID,
            "AWS::Partition": "aws",
            "AWS::StackName": stack_name,
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::NoValue": NO_VALUE,
        }

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [item for item in (self.resolve(item) for item in value) if item is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            (function, argument), *_ = value.items()
            if function == "Ref" or function.startswith("Fn::") or function == "Condition":
                return self._intrinsic(function, argument)
        resolved = {key: self.resolve(item) for key, item in value.items()}
        return {key: item for key, item in resolved.items() if item is not NO_VALUE}

    def condition(self, name: str) -> bool:
        return bool(self.resolve(self._template["Conditions"][name]))

    def _intrinsic(self, function: str, argument: Any) -> Any:
        if function == "Ref":
            return self._ref(argument)
        if function == "Fn::GetAtt":
            logical_id, attribute = argument.split(".", 1) if isinstance(argument, str) else argument
            return ResourceRef(logical_id, attribute)
        if function == "Fn::FindInMap":
            mapping, top, second = (str(self.resolve(part)) for part in argument)
            return self._template["Mappings"][mapping][top][second]
        if function == "Fn::If":
            name, when_true, when_false = argument
            return self.resolve(when_true if self.condition(name) else when_false)
        if function == "Condition":
            return self.condition(argument)
        if function == "Fn::Equals":
            left, right = (self.resolve(part) for part in argument)
            return str(left) == str(right)
        if function == "Fn::Not":
            return not self.resolve(argument[0])
        if function == "Fn::And":
            return all(self.resolve(part) for part in argument)
        if function == "Fn::Or":
            return any(self.resolve(part) for part in argument)
        if function == "Fn::Sub":
            return self._sub(argument)
        raise NotImplementedError(f"{function} is not resolved by these tests")

    def _ref(self, name: str) -> Any:
        if name in self._pseudo:
            return self._pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        if name in self._template["Resources"]:
            return ResourceRef(name)
        raise KeyError(f"Ref to unknown name {name!r}")

    def _sub(self, argument: str | list[Any]) -> str:
        text, variables = (argument, {}) if isinstance(argument, str) else argument

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            value = self.resolve(variables[name]) if name in variables else self._ref(name)
            if isinstance(value, ResourceRef):
                raise NotImplementedError(f"Fn::Sub of a resource ({name}) has no value before deployment")
            return str(value)

        return _SUB_VARIABLE.sub(substitute, text)


def policy_statements(template: Mapping[str, Any], role_id: str) -> list[dict[str, Any]]:
    """Every statement granted to a role: its inline policies and any AWS::IAM::Policy attached to it."""
    role = properties(template, role_id)
    documents = [policy["PolicyDocument"] for policy in role.get("Policies", [])]
    for policy in resources_of_type(template, "AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"].get("Roles", []):
            documents.append(policy["Properties"]["PolicyDocument"])
    return [statement for document in documents for statement in as_list(document["Statement"])]


def grants_by_resource(template: Mapping[str, Any], role_id: str) -> dict[str, set[str]]:
    """Allowed actions per logical id of the stack resource they apply to (via its Arn)."""
    resolver = Resolver(template)
    grants: dict[str, set[str]] = {}
    for statement in policy_statements(template, role_id):
        if statement["Effect"] != "Allow":
            continue
        for resource in as_list(resolver.resolve(statement["Resource"])):
            if not isinstance(resource, ResourceRef) or resource.attribute != "Arn":
                raise AssertionError(f"statement {statement.get('Sid')} grants on {resource!r}, not a stack resource")
            grants.setdefault(resource.logical_id, set()).update(as_list(statement["Action"]))
    return grants


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]
