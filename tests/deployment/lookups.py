"""Questions the infrastructure tests ask of the transformed template, read by ``testkit.template``."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

import boto3
from samtranslator.public.parser import Parser
from samtranslator.public.translator import Translator

from consumer.config import URL_PATTERN, is_api_url, table_parameter
from consumer.outbox import OUTBOX_TABLE
from testkit.template import (
    ACCOUNT_ID,
    LOCAL_TABLES,
    PARTITION,
    REGION,
    REPO_ROOT,
    ResourceRef,
    Template,
    TemplateError,
)

SAMCONFIG_PATH = REPO_ROOT / "samconfig.toml"
# SQS: up to 80 characters, a FIFO queue's ending in ".fifo".
SQS_QUEUE_NAME = re.compile(r"(?=.{1,80}$)[A-Za-z0-9_-]+(\.fifo)?")
STACK_NAME = "idempotent-sqs-consumer"
# What Lambda's event source mapping does with the function's role: poll, delete, read attributes.
EVENT_SOURCE_POLLING = frozenset({"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"})
# The tables of the core's own, in every template: the idempotency records and the outbox.
CORE_TABLES = ("IdempotencyTable", OUTBOX_TABLE)
# What a handler may emit to (MessageHandler.destinations), by resource type: the one action the relay sends with.
DESTINATION_SENDS = {
    "AWS::SQS::Queue": "sqs:SendMessage",
    "AWS::SNS::Topic": "sns:Publish",
    "AWS::Events::EventBus": "events:PutEvents",
}


# What `sam package` puts in place of a local CodeUri before CloudFormation transforms the template.
PACKAGED_CODE_URI = "s3://packaged-artifacts/consumer.zip"


def transform(source: Mapping[str, Any]) -> dict[str, Any]:
    """The CloudFormation template the AWS::Serverless transform (aws-sam-translator, the one ``sam deploy`` runs,
    offline) produces from ``source``. The template grants no managed policies, so the translator never needs IAM to
    look one up; it fails if it tries."""
    packaged = copy.deepcopy(dict(source))
    for resource in packaged["Resources"].values():
        if resource["Type"] == "AWS::Serverless::Function":
            resource["Properties"]["CodeUri"] = PACKAGED_CODE_URI
    translator = Translator({}, Parser(), boto_session=boto3.session.Session(region_name=REGION))
    return translator.translate(packaged, {}, get_managed_policy_map=_refuse_managed_policy_lookup)


def _refuse_managed_policy_lookup() -> dict[str, str]:
    raise TemplateError("the template refers to an AWS managed policy; it should grant explicit statements only")


def read(document: Mapping[str, Any], **overrides: Any) -> Template:
    """``document`` with the given parameter values (the others at their defaults)."""
    return Template(dict(document), stack_name=STACK_NAME, parameter_overrides=overrides)


def resources_of_type(template: Mapping[str, Any], resource_type: str) -> dict[str, dict[str, Any]]:
    return {name: body for name, body in template["Resources"].items() if body["Type"] == resource_type}


def properties(template: Mapping[str, Any], logical_id: str) -> dict[str, Any]:
    return template["Resources"][logical_id].get("Properties", {})


def event_source_mapping(template: Mapping[str, Any], function: str = "ConsumerFunction") -> dict[str, Any]:
    """Properties of the event source mapping of ``function``: the consumer's SQS event, or the relay's stream."""
    mappings = resources_of_type(template, "AWS::Lambda::EventSourceMapping").values()
    (mapping,) = [mapping for mapping in mappings if mapping["Properties"]["FunctionName"] == {"Ref": function}]
    return mapping["Properties"]


def parameter_name(expression: Any) -> str:
    """The one parameter a property takes its value from, directly or in a branch of ``Fn::If``; fails on a literal."""
    names = set(_referenced_names(expression)) - {"AWS::NoValue"}
    assert len(names) == 1, f"expected a value from one parameter, got {expression!r}"
    return names.pop()


def _referenced_names(expression: Any) -> list[str]:
    if isinstance(expression, list):
        return [name for item in expression for name in _referenced_names(item)]
    if not isinstance(expression, dict):
        return []
    if set(expression) == {"Ref"}:
        return [expression["Ref"]]
    if set(expression) == {"Fn::If"}:
        return _referenced_names(expression["Fn::If"][1:])
    raise AssertionError(f"expected a parameter reference, got {expression!r}")


def parameter_candidates(template: Mapping[str, Any], name: str) -> list[Any]:
    """Every value a parameter can take, or its extremes and default when it is a range."""
    spec = template["Parameters"][name]
    if "AllowedValues" in spec:
        return list(spec["AllowedValues"])
    return sorted({spec[key] for key in ("MinValue", "Default", "MaxValue") if key in spec})


def policy_statements(template: Mapping[str, Any], role_id: str, **overrides: Any) -> list[dict[str, Any]]:
    """Every statement granted to a role: its inline policies and any AWS::IAM::Policy attached to it
    that the parameters (``overrides``, the others at their defaults) create."""
    reading = read(template, **overrides)
    role = properties(template, role_id)
    documents = [policy["PolicyDocument"] for policy in role.get("Policies", [])]
    for policy in resources_of_type(template, "AWS::IAM::Policy").values():
        created = "Condition" not in policy or reading.condition(policy["Condition"])
        if created and {"Ref": role_id} in policy["Properties"].get("Roles", []):
            documents.append(policy["Properties"]["PolicyDocument"])
    statements = [statement for document in documents for statement in as_list(document["Statement"])]
    return [chosen for statement in statements for chosen in _chosen(statement, reading)]


def _chosen(statement: dict[str, Any], reading: Template) -> list[dict[str, Any]]:
    """A statement, or for one under Fn::If (the X-Ray grant) the branch the parameters choose, if any."""
    if set(statement) != {"Fn::If"}:
        return [statement]
    condition, when_true, when_false = statement["Fn::If"]
    branch = when_true if reading.condition(condition) else when_false
    return [] if branch == {"Ref": "AWS::NoValue"} else [branch]


def grants_by_statement(template: Mapping[str, Any], role_id: str, **overrides: Any) -> dict[str, dict[str, set[str]]]:
    """Allowed actions per statement (its Sid, or its index) and per logical id of the stack resource they apply to
    (via its Arn, a topic's Ref, or the ARN of a table a parameter names; a table's stream as ``<table>.StreamArn``),
    or per exact ARN for what else lives outside the stack and a parameter names (the webhook secret)."""
    reading = read(template, **overrides)
    # A table given by a parameter is granted on the ARN its name makes: named by its logical id, as a resource is.
    arn = f"arn:{PARTITION}:dynamodb:{reading.region}:{ACCOUNT_ID}:table/"
    tables = {
        arn + str(reading.parameters[table_parameter(table)]): table
        for table in reading.local(LOCAL_TABLES)
        if table_parameter(table) in reading.parameters
    }
    grants: dict[str, dict[str, set[str]]] = {}
    for index, statement in enumerate(policy_statements(template, role_id, **overrides)):
        if statement["Effect"] != "Allow":
            continue
        by_resource = grants.setdefault(statement.get("Sid") or f"statement {index}", {})
        for resource in as_list(reading.resolve(statement["Resource"])):
            if isinstance(resource, ResourceRef) and (resource.attribute == "Arn" or _topic(template, resource)):
                by_resource.setdefault(resource.logical_id, set()).update(as_list(statement["Action"]))
            elif isinstance(resource, ResourceRef) and resource.attribute == "StreamArn":
                by_resource.setdefault(str(resource), set()).update(as_list(statement["Action"]))
            elif isinstance(resource, str) and resource.startswith("arn:") and "*" not in resource:
                by_resource.setdefault(tables.get(resource, resource), set()).update(as_list(statement["Action"]))
            elif resource == "*" and all(action.startswith("xray:") for action in as_list(statement["Action"])):
                # X-Ray has no resource-level permissions: its actions are granted on "*" or not at all.
                by_resource.setdefault(resource, set()).update(as_list(statement["Action"]))
            else:
                raise AssertionError(f"statement {statement.get('Sid')} grants on {resource!r}, not a stack resource")
    return grants


def _topic(template: Mapping[str, Any], resource: ResourceRef) -> bool:
    """A topic's Ref: its ARN, what SNS grants on."""
    kind = template["Resources"].get(resource.logical_id, {}).get("Type")
    return resource.attribute is None and kind == "AWS::SNS::Topic"


def grants_by_resource(template: Mapping[str, Any], role_id: str, **overrides: Any) -> dict[str, set[str]]:
    """Allowed actions per resource (as ``grants_by_statement`` names them), whichever statement allows them."""
    grants: dict[str, set[str]] = {}
    for by_resource in grants_by_statement(template, role_id, **overrides).values():
        for resource, actions in by_resource.items():
            grants.setdefault(resource, set()).update(actions)
    return grants


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def key_schema(table: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """A table's key attribute -> (key type, attribute type)."""
    types = {definition["AttributeName"]: definition["AttributeType"] for definition in table["AttributeDefinitions"]}
    return {key["AttributeName"]: (key["KeyType"], types[key["AttributeName"]]) for key in table["KeySchema"]}


def table_mistakes(template: dict[str, Any], declared: tuple[str, ...]) -> list[str]:
    """Each declared table neither a resource nor given by its parameter (with its keys for the local stack), and
    each table or table parameter no handler declares."""
    tables = resources_of_type(template, "AWS::DynamoDB::Table")
    parameters = template.get("Parameters") or {}
    local_tables = (template.get("Metadata") or {}).get(LOCAL_TABLES) or {}
    mistakes = []
    for table in dict.fromkeys((*CORE_TABLES, *declared)):
        if table in tables:
            continue
        parameter = table_parameter(table)
        if parameter not in parameters:
            mistakes.append(
                f"a handler declares {table}: add an AWS::DynamoDB::Table of that name to template.yaml, or a"
                f" parameter {parameter} naming an existing table"
            )
        elif table not in local_tables:
            mistakes.append(
                f"{table} is the existing table parameter {parameter} names: give its keys for the local stack under"
                f" the template's Metadata, {LOCAL_TABLES}: {table}: (AttributeDefinitions, KeySchema)"
            )
    wanted = {*CORE_TABLES, *declared}
    mistakes += [f"{table} is in template.yaml but no handler declares it: remove it" for table in set(tables) - wanted]
    mistakes += [
        f"{LOCAL_TABLES} describes {table}, which no handler declares by its parameter {table_parameter(table)}:"
        " remove it"
        for table in sorted(set(local_tables) - (wanted - set(tables)))
    ]
    return sorted(mistakes)


def destination_mistakes(template: Mapping[str, Any], declared: tuple[str, ...]) -> list[str]:
    """Each destination a handler declares that is not a queue, topic or bus of the template."""
    kinds = "an AWS::SQS::Queue, AWS::SNS::Topic or AWS::Events::EventBus"
    mistakes = []
    for destination in declared:
        kind = template["Resources"].get(destination, {}).get("Type")
        if kind is None:
            mistakes.append(
                f"a handler declares {destination} as a destination: add {kinds} of that name to template.yaml"
            )
        elif kind not in DESTINATION_SENDS:
            mistakes.append(
                f"a handler declares {destination} as a destination, but template.yaml's {destination} is an {kind}:"
                f" a handler emits to {kinds} alone"
            )
    return mistakes


def endpoint_mistakes(template: dict[str, Any], models: Any) -> list[str]:
    """Each ``ApiUrl`` setting whose variable does not come from a parameter of ``ApiUrl``'s pattern: the local stack
    and the generic contract know an endpoint's parameter by that pattern, whatever its name, and no other way."""
    variables = properties(template, "ConsumerFunction")["Environment"]["Variables"]
    parameters = template.get("Parameters") or {}
    mistakes = []
    for model in models:
        for name in (name for name in model.model_fields if is_api_url(model, name)):
            variable, where = name.upper(), f"{model.__name__}.{name}"
            if variable not in variables:
                continue  # test_environment_is_what_the_code_reads names a variable the function lacks
            source = variables[variable]
            parameter = source.get("Ref") if isinstance(source, dict) else None
            if parameter not in parameters or parameters[parameter].get("AllowedPattern") != URL_PATTERN:
                mistakes.append(
                    f"{variable} ({where}) is an ApiUrl: give it to the function from a parameter"
                    f" ({variable}: !Ref <its parameter>) whose AllowedPattern is {URL_PATTERN}, by which the local"
                    " stack and the contract point it at their webhook sink, whatever its name"
                )
    return mistakes
