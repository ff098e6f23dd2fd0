"""Read ``template.yaml`` and resolve it the way CloudFormation would, for the local stack.

The local stack creates its queues and tables from the template itself, so that local
and deployed cannot drift: names, visibility timeout, redrive policy, keys, TTL, the
function's handler, timeout and environment, and the SQS event's batch settings.

What is resolved: parameters (defaults, overrides, allowed values and bounds),
pseudo parameters, conditions, ``Ref``, ``Fn::GetAtt``, ``Fn::Sub``, ``Fn::If``,
``Fn::FindInMap``, ``Fn::Join``, ``Fn::Select``, ``Fn::Split``, ``Fn::Equals``,
``Fn::Not``, ``Fn::And``, ``Fn::Or`` and SAM's ``Globals.Function``. Physical ids of
the resources are supplied by the caller (``PhysicalIds``), so resolution stays free
of I/O and creating resources happens in ``local.resources``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATE_PATH = REPO_ROOT / "template.yaml"
ACCOUNT_ID = "123456789012"  # moto's default account: queue URLs and ARNs match what it returns
PARTITION = "aws"


class TemplateError(ValueError):
    """The template uses something the local stack cannot resolve, or a parameter is invalid."""


# -- YAML with CloudFormation's short tags ------------------------------------------------


class _CloudFormationLoader(yaml.SafeLoader):
    """SafeLoader that turns ``!Ref x`` into ``{"Ref": "x"}``, ``!Sub s`` into ``{"Fn::Sub": s}``..."""


def _short_tag(loader: yaml.SafeLoader, tag_suffix: str, node: yaml.Node) -> dict[str, Any]:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if tag_suffix in ("Ref", "Condition"):
        return {tag_suffix: value}
    if tag_suffix == "GetAtt" and isinstance(value, str):
        # The short form is "Resource.Attribute"; attributes may contain dots themselves.
        resource, _, attribute = value.partition(".")
        value = [resource, attribute]
    return {f"Fn::{tag_suffix}": value}


_CloudFormationLoader.add_multi_constructor("!", _short_tag)


def load_template(path: Path = TEMPLATE_PATH) -> dict[str, Any]:
    with Path(path).open(encoding="utf-8") as stream:
        document = yaml.load(stream, Loader=_CloudFormationLoader)
    if not isinstance(document, dict) or not isinstance(document.get("Resources"), dict):
        raise TemplateError(f"{path} is not a CloudFormation template (no Resources)")
    return document


# -- resolution --------------------------------------------------------------------------


class PhysicalIds(Protocol):
    """Where resolution learns what a resource is called locally (``Ref``) and its attributes."""

    def ref(self, logical_id: str) -> str: ...

    def get_att(self, logical_id: str, attribute: str) -> str: ...


class _NoValue:
    """``AWS::NoValue``: the property is removed, as if it were not written."""


NO_VALUE = _NoValue()


@dataclass
class Template:
    """A loaded template with its parameters fixed; ``resolve`` evaluates intrinsic functions."""

    document: dict[str, Any]
    path: Path | None = None
    stack_name: str = "local"
    region: str = "us-east-1"
    parameter_overrides: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.parameters = self._parameters()
        self._conditions: dict[str, bool] = {}

    @classmethod
    def from_file(cls, path: Path = TEMPLATE_PATH, **options: Any) -> Template:
        return cls(load_template(path), Path(path), **options)

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        return self.document["Resources"]

    def resources_of_type(self, resource_type: str) -> list[str]:
        return [name for name, resource in self.resources.items() if resource.get("Type") == resource_type]

    def properties(self, logical_id: str, ids: PhysicalIds | None) -> dict[str, Any]:
        """The resource's properties with every intrinsic function resolved."""
        resource = self.resources.get(logical_id)
        if resource is None:
            raise TemplateError(f"no resource {logical_id!r} in the template")
        properties = dict(resource.get("Properties") or {})
        if resource.get("Type") == "AWS::Serverless::Function":
            properties = _merge_globals((self.document.get("Globals") or {}).get("Function") or {}, properties)
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
            self._conditions[name] = bool(self._evaluate(definitions[name], None))
        return self._conditions[name]

    def resolve(self, value: Any, ids: PhysicalIds | None) -> Any:
        """Evaluate intrinsic functions in ``value``; ``AWS::NoValue`` entries disappear."""
        resolved = self._evaluate(value, ids)
        return None if resolved is NO_VALUE else resolved

    # -- internals -------------------------------------------------------------------

    def _parameters(self) -> dict[str, Any]:
        declared = self.document.get("Parameters") or {}
        unknown = set(self.parameter_overrides) - set(declared)
        if unknown:
            raise TemplateError(f"unknown parameter(s): {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        for name, spec in declared.items():
            if name in self.parameter_overrides:
                value = self.parameter_overrides[name]
            elif "Default" in spec:
                value = spec["Default"]
            else:
                raise TemplateError(f"parameter {name} has no default: pass a value for it")
            values[name] = _checked_parameter(name, spec, value)
        return values

    def _evaluate(self, value: Any, ids: PhysicalIds | None) -> Any:
        if isinstance(value, list):
            items = [self._evaluate(item, ids) for item in value]
            return [item for item in items if item is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, argument),) = value.items()
            function = self._functions().get(key)
            if function is not None:
                return function(argument, ids)
        items = {key: self._evaluate(item, ids) for key, item in value.items()}
        return {key: item for key, item in items.items() if item is not NO_VALUE}

    def _functions(self) -> dict[str, Callable[[Any, PhysicalIds | None], Any]]:
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

    def _ref(self, name: Any, ids: PhysicalIds | None) -> Any:
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in self.parameters:
            return self.parameters[name]
        pseudo = self.pseudo_parameters()
        if name in pseudo:
            return pseudo[name]
        if name in self.resources and ids is not None:
            return ids.ref(name)
        raise TemplateError(f"cannot resolve Ref {name!r}")

    def _get_att(self, argument: Any, ids: PhysicalIds | None) -> str:
        logical_id, attribute = (self._evaluate(part, ids) for part in argument)
        if logical_id not in self.resources or ids is None:
            raise TemplateError(f"cannot resolve GetAtt {logical_id}.{attribute}")
        return ids.get_att(logical_id, attribute)

    def _sub(self, argument: Any, ids: PhysicalIds | None) -> str:
        if isinstance(argument, list):
            text, variables = argument[0], {k: self._evaluate(v, ids) for k, v in (argument[1] or {}).items()}
        else:
            text, variables = argument, {}

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

    def _if(self, argument: Any, ids: PhysicalIds | None) -> Any:
        name, when_true, when_false = argument
        return self._evaluate(when_true if self.condition(name) else when_false, ids)

    def _find_in_map(self, argument: Any, ids: PhysicalIds | None) -> Any:
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


def _merge_globals(globals_: Mapping[str, Any], properties: Mapping[str, Any]) -> dict[str, Any]:
    """SAM's rule: the function's own value wins; maps (like Environment.Variables) merge."""
    merged: dict[str, Any] = dict(globals_)
    for key, value in properties.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge_globals(merged[key], value)
        else:
            merged[key] = value
    return merged
