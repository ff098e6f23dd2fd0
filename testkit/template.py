"""The one reader of ``template.yaml``: load it, evaluate its intrinsics.

The local stack deploys what this module reads, and the infrastructure tests assert on what it reads, so the two cannot
disagree about what the template means.

Parsing is cfn-lint's decoder (the one ``make validate`` lints with); the infrastructure tests transform what it reads
with aws-sam-translator (tests/deployment/lookups.py). Neither library evaluates intrinsic functions for given
parameters, so that part is here: parameters (defaults, overrides, allowed values and bounds), ``Rules``, pseudo
parameters, conditions and the intrinsic functions (``Template._functions``); SAM's ``Globals`` are merged as the
translator merges them. What a resource is called is supplied by the caller (``PhysicalIds``): the local stack
creates the resource on first reference, the tests keep it symbolic (``SYMBOLIC``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cfnlint.decode import cfn_yaml
from samtranslator.plugins.globals.globals import Globals

from consumer.config import URL_PATTERN, parameter_table, table_parameter

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATE_PATH = REPO_ROOT / "template.yaml"
ACCOUNT_ID = "123456789012"  # moto's default account: queue URLs and ARNs match what it returns
PARTITION = "aws"
REGION = "us-east-1"
# Metadata read by make test and the local stack alone, for what a deployment is given: a value for each parameter
# without a Default, and the keys of each table given by a parameter (``consumer.config.table_parameter``).
LOCAL_PARAMETERS, LOCAL_TABLES = "LocalParameters", "LocalTables"


def url_parameters(document: Mapping[str, Any]) -> list[str]:
    """The parameters that take an endpoint's URL (their AllowedPattern is ``ApiUrl``'s, ``URL_PATTERN``), any name."""
    parameters = document.get("Parameters") or {}
    return [name for name, spec in parameters.items() if spec.get("AllowedPattern") == URL_PATTERN]


def secret_parameters(document: Mapping[str, Any]) -> list[str]:
    """The parameters that take a Secrets Manager secret's ARN (their AllowedPattern is ``SecretArn``'s), any name."""
    parameters = document.get("Parameters") or {}
    return [name for name, spec in parameters.items() if "secretsmanager" in str(spec.get("AllowedPattern", ""))]


class TemplateError(ValueError):
    """The template uses something this reader cannot resolve, or a parameter value is invalid."""


def load_template(path: Path = TEMPLATE_PATH) -> dict[str, Any]:
    """The template as plain data, short-form tags (``!Ref x``) in their long form (``{"Ref": "x"}``)."""
    # Plain dicts and lists (the decoder's nodes carry line numbers), a new copy for each caller to change.
    document = json.loads(_decoded(Path(path).read_text(encoding="utf-8"), str(path)))
    if not isinstance(document, dict) or not isinstance(document.get("Resources"), dict):
        raise TemplateError(f"{path} is not a CloudFormation template (no Resources)")
    return document


@functools.lru_cache(maxsize=8)
def _decoded(text: str, name: str) -> str:
    """The template as JSON, parsed once per content: the tests load it hundreds of times, and YAML is the slow part."""
    return json.dumps(cfn_yaml.loads(text, name))


class PhysicalIds(Protocol):
    """Where resolution learns what a resource is called (``Ref``) and its attributes (``GetAtt``)."""

    def ref(self, logical_id: str) -> Any: ...

    def get_att(self, logical_id: str, attribute: str) -> Any: ...


@dataclass(frozen=True)
class ResourceRef:
    """A resource's value before deployment: ``Ref`` (attribute None) or ``Fn::GetAtt``."""

    logical_id: str
    attribute: str | None = None

    def __str__(self) -> str:
        # Inside Fn::Sub the reference stays recognisable, e.g. "ConsumerQueue.QueueName".
        return self.logical_id if self.attribute is None else f"{self.logical_id}.{self.attribute}"


class _SymbolicIds:
    def ref(self, logical_id: str) -> ResourceRef:
        return ResourceRef(logical_id)

    def get_att(self, logical_id: str, attribute: str) -> ResourceRef:
        return ResourceRef(logical_id, attribute)


SYMBOLIC: PhysicalIds = _SymbolicIds()


class _NoValue:
    """``AWS::NoValue``: the property is removed, as if it were not written."""


NO_VALUE = _NoValue()


@dataclass
class Template:
    """A loaded template with its parameters fixed; ``resolve`` evaluates intrinsic functions."""

    document: dict[str, Any]
    path: Path | None = None
    stack_name: str = "local"
    region: str = REGION
    parameter_overrides: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._conditions: dict[str, bool] = {}
        self.parameters = self._parameters()
        self._check_rules()

    @classmethod
    def from_file(cls, path: Path = TEMPLATE_PATH, **options: Any) -> Template:
        return cls(load_template(path), Path(path), **options)

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        return self.document["Resources"]

    def local(self, key: str) -> dict[str, Any]:
        return dict((self.document.get("Metadata") or {}).get(key) or {})

    def resources_of_type(self, resource_type: str) -> list[str]:
        return [name for name, resource in self.resources.items() if resource.get("Type") == resource_type]

    def properties(self, logical_id: str, ids: PhysicalIds = SYMBOLIC) -> dict[str, Any]:
        """The resource's properties with every intrinsic function resolved."""
        if (resource := self.resources.get(logical_id)) is None:
            raise TemplateError(f"no resource {logical_id!r} in the template")
        properties = dict(resource.get("Properties") or {})
        if "Globals" in self.document:
            properties = Globals(self.document).merge(resource.get("Type", ""), properties)
        resolved = self.resolve(properties, ids)
        return resolved if isinstance(resolved, dict) else {}

    def pseudo_parameters(self) -> dict[str, str]:
        return {
            "AWS::StackName": self.stack_name,
            "AWS::Region": self.region,
            "AWS::AccountId": ACCOUNT_ID,
            "AWS::Partition": PARTITION,
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackId": f"arn:{PARTITION}:cloudformation:{self.region}:{ACCOUNT_ID}:stack/{self.stack_name}/local",
        }

    def condition(self, name: str) -> bool:
        if name not in self._conditions:
            definitions = self.document.get("Conditions") or {}
            if name not in definitions:
                raise TemplateError(f"no condition {name!r} in the template")
            self._conditions[name] = bool(self._evaluate(definitions[name], SYMBOLIC))
        return self._conditions[name]

    def resolve(self, value: Any, ids: PhysicalIds = SYMBOLIC) -> Any:
        """Evaluate intrinsic functions in ``value``; ``AWS::NoValue`` entries disappear."""
        resolved = self._evaluate(value, ids)
        return None if resolved is NO_VALUE else resolved

    def _parameters(self) -> dict[str, Any]:
        declared = self.document.get("Parameters") or {}
        if unknown := set(self.parameter_overrides) - set(declared):
            raise TemplateError(f"unknown parameter(s): {', '.join(sorted(unknown))}")
        # A table given by a parameter is, locally, the one made from its LocalTables keys, named as a resource is.
        local = {table_parameter(table): f"{self.stack_name}-{table}" for table in self.local(LOCAL_TABLES)}
        local |= self.local(LOCAL_PARAMETERS)
        values: dict[str, Any] = {}
        for name, spec in declared.items():
            if name in self.parameter_overrides:
                value = self.parameter_overrides[name]
            elif "Default" in spec:
                value = spec["Default"]
            elif name in local:
                value = local[name]
            else:
                table = parameter_table(name)
                where = (
                    f"{table}'s keys under {LOCAL_TABLES}:" if table else f'"{name}: <value>" under {LOCAL_PARAMETERS}:'
                )
                raise TemplateError(
                    f"parameter {name} has no Default: for make test and the local stack, add {where} in the template's"
                    f" Metadata (a deployment is given its own: samconfig.toml's parameter_overrides, or PARAMETERS=)"
                )
            values[name] = _checked_parameter(name, spec, value)
        return values

    def _check_rules(self) -> None:
        """CloudFormation refuses a stack whose parameters break a rule; so does this reader."""
        for name, rule in (self.document.get("Rules") or {}).items():
            if "RuleCondition" in rule and not self._evaluate(rule["RuleCondition"], SYMBOLIC):
                continue
            for assertion in rule.get("Assertions") or []:
                if not self._evaluate(assertion["Assert"], SYMBOLIC):
                    raise TemplateError(f"rule {name}: {assertion.get('AssertDescription', 'assertion failed')}")

    def _evaluate(self, value: Any, ids: PhysicalIds) -> Any:
        if isinstance(value, list):
            items = [self._evaluate(item, ids) for item in value]
            return [item for item in items if item is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, argument),) = value.items()
            if (function := self._functions().get(key)) is not None:
                return function(argument, ids)
        entries = {key: self._evaluate(item, ids) for key, item in value.items()}
        return {key: item for key, item in entries.items() if item is not NO_VALUE}

    def _functions(self) -> dict[str, Callable[[Any, PhysicalIds], Any]]:
        return {
            "Ref": self._ref,
            "Fn::GetAtt": self._get_att,
            "Fn::Sub": self._sub,
            "Fn::If": self._if,
            "Fn::FindInMap": self._find_in_map,
            "Fn::Join": lambda arg, ids: str(arg[0]).join(str(part) for part in self._evaluate(arg[1], ids)),
            "Fn::Select": lambda arg, ids: self._evaluate(arg[1], ids)[int(self._evaluate(arg[0], ids))],
            "Fn::Split": lambda arg, ids: str(self._evaluate(arg[1], ids)).split(str(arg[0])),
            "Fn::Equals": lambda arg, ids: _same(self._evaluate(arg[0], ids), self._evaluate(arg[1], ids)),
            "Fn::Not": lambda arg, ids: not self._evaluate(arg[0], ids),
            "Fn::And": lambda arg, ids: all(self._evaluate(item, ids) for item in arg),
            "Fn::Or": lambda arg, ids: any(self._evaluate(item, ids) for item in arg),
            "Condition": lambda arg, ids: self.condition(arg),
        }

    def _ref(self, name: Any, ids: PhysicalIds) -> Any:
        if name == "AWS::NoValue":
            return NO_VALUE
        values = {**self.pseudo_parameters(), **self.parameters}
        if name in values:
            return values[name]
        if name in self.resources:
            return ids.ref(name)
        raise TemplateError(f"cannot resolve Ref {name!r}")

    def _get_att(self, argument: Any, ids: PhysicalIds) -> Any:
        logical_id, attribute = (self._evaluate(part, ids) for part in argument)
        if logical_id not in self.resources:
            raise TemplateError(f"cannot resolve GetAtt {logical_id}.{attribute}")
        return ids.get_att(logical_id, attribute)

    def _sub(self, argument: Any, ids: PhysicalIds) -> str:
        text, given = (argument[0], argument[1] or {}) if isinstance(argument, list) else (argument, {})
        variables = {k: self._evaluate(v, ids) for k, v in given.items()}

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in variables:
                return str(variables[name])
            if "." in name and name.split(".", 1)[0] in self.resources:
                return str(self._get_att(name.split(".", 1), ids))
            return str(self._ref(name, ids))

        return re.sub(r"\$\{([^}]+)\}", replace, str(text))

    def _if(self, argument: Any, ids: PhysicalIds) -> Any:
        name, when_true, when_false = argument
        return self._evaluate(when_true if self.condition(name) else when_false, ids)

    def _find_in_map(self, argument: Any, ids: PhysicalIds) -> Any:
        map_name, top, second = (str(self._evaluate(part, ids)) for part in argument[:3])
        try:
            return self._evaluate(self.document["Mappings"][map_name][top][second], ids)
        except KeyError:
            raise TemplateError(f"FindInMap: no {map_name}/{top}/{second} in Mappings") from None


def _same(left: Any, right: Any) -> bool:
    # CloudFormation compares strings: a Number parameter equals its string form.
    return str(left) == str(right)


def _checked_parameter(name: str, spec: Mapping[str, Any], value: Any) -> Any:
    allowed = spec.get("AllowedValues")
    if allowed is not None and str(value) not in {str(item) for item in allowed}:
        raise TemplateError(f"parameter {name}={value!r} is not one of {allowed}")
    if spec.get("Type") == "Number":
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise TemplateError(f"parameter {name} must be a number, got {value!r}") from None
        if "MinValue" in spec and number < float(spec["MinValue"]):
            raise TemplateError(f"parameter {name}={value} is below its MinValue {spec['MinValue']}")
        if "MaxValue" in spec and number > float(spec["MaxValue"]):
            raise TemplateError(f"parameter {name}={value} is above its MaxValue {spec['MaxValue']}")
        return int(number) if number.is_integer() else number
    value = str(value)
    pattern = spec.get("AllowedPattern")
    if pattern is not None and re.fullmatch(pattern, value) is None:
        raise TemplateError(f"parameter {name}={value!r} does not match {pattern}")
    return value
