"""Read and write capacity units from item sizes, by DynamoDB's published rules.

moto reports a constant ``ConsumedCapacity`` and DynamoDB Local none, so the units are
computed here from the items themselves:

- item size: attribute names plus values (strings and binaries by their bytes, numbers
  about one byte per two significant digits plus one, maps and lists 3 bytes plus one
  per element);
- a write consumes 1 WCU per started KB of the larger of the item before and after it;
  a failed condition still consumes them (the larger of the existing and the proposed
  item); a delete is charged the deleted item's size;
- in ``TransactWriteItems`` every action costs twice that, ``ConditionCheck`` included.
  AWS does not say what a cancelled transaction costs; it is charged here as if every
  action had been attempted (an upper bound);
- a strongly consistent read consumes 1 RCU per started 4 KB (half when eventually
  consistent), also when there is no item.

The meter reads each targeted item before and after a write through its own client,
outside the counted calls. Those reads assume no other writer touches the same item
between them, which holds for the benchmark's records (every key and account unique).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from bench.hooks import HandlerSpec, observed, unobserved

WRITE_UNIT_BYTES = 1024
READ_UNIT_BYTES = 4096
TRANSACTION_FACTOR = 2
_CONDITION_FAILURES = frozenset({"ConditionalCheckFailedException", "TransactionCanceledException"})
_TRANSACT_ACTIONS = ("Put", "Update", "Delete", "ConditionCheck")


def number_size(text: str) -> int:
    mantissa = text.lstrip("+-").lower().split("e", 1)[0]
    digits = mantissa.replace(".", "").lstrip("0").rstrip("0")
    return (len(digits) + 1) // 2 + 1


def value_size(value: Mapping[str, Any]) -> int:
    """Size in bytes of one low-level attribute value such as ``{"S": "abc"}``."""
    ((kind, raw),) = value.items()
    if kind == "S":
        return len(raw.encode("utf-8"))
    if kind == "N":
        return number_size(raw)
    if kind == "B":
        return len(raw)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(member.encode("utf-8")) for member in raw)
    if kind == "NS":
        return sum(number_size(member) for member in raw)
    if kind == "BS":
        return sum(len(member) for member in raw)
    if kind == "L":
        return 3 + sum(1 + value_size(member) for member in raw)
    if kind == "M":
        return 3 + sum(1 + len(name.encode("utf-8")) + value_size(member) for name, member in raw.items())
    raise ValueError(f"unknown attribute type {kind!r}")


def item_size(item: Mapping[str, Mapping[str, Any]] | None) -> int:
    if not item:
        return 0
    return sum(len(name.encode("utf-8")) + value_size(value) for name, value in item.items())


def _transact_actions(params: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for item in params["TransactItems"]:
        for action in _TRANSACT_ACTIONS:
            if action in item:
                yield action, item[action]


def write_units(size_bytes: int) -> int:
    return max(1, math.ceil(size_bytes / WRITE_UNIT_BYTES))


def read_units(size_bytes: int, *, consistent: bool) -> float:
    units = max(1, math.ceil(size_bytes / READ_UNIT_BYTES))
    return float(units) if consistent else units / 2


@dataclass(frozen=True)
class CapacityReading:
    write_units: float
    read_units: float


@dataclass(frozen=True)
class _Target:
    """One item a write touches, and its size before the write."""

    table: str
    key: dict[str, Any]
    size_before: int
    # A Put's item; Updates and ConditionChecks propose no whole item.
    proposed_size: int


@dataclass(frozen=True)
class _PendingWrite:
    targets: tuple[_Target, ...]
    factor: int


class CapacityMeter:
    def __init__(self, reader: Any) -> None:
        self._reader = reader
        # Off while timing: its own reads would add to the measured wall time.
        self.enabled = True
        self._lock = threading.Lock()
        self._key_names: dict[str, tuple[str, ...]] = {}
        self._write_units = 0.0
        self._read_units = 0.0

    def handler_specs(self) -> list[HandlerSpec]:
        return [
            ("before-parameter-build.dynamodb", self._before_call),
            ("after-call.dynamodb", self._after_call),
        ]

    def reading(self) -> CapacityReading:
        with self._lock:
            return CapacityReading(self._write_units, self._read_units)

    # -- handlers -----------------------------------------------------------------

    def _before_call(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        if not (self.enabled and observed()):
            return
        if model.name == "TransactWriteItems":
            targets = tuple(self._target(action, request) for action, request in _transact_actions(params))
            context["bench_write"] = _PendingWrite(targets, TRANSACTION_FACTOR)
        elif model.name in ("PutItem", "UpdateItem", "DeleteItem"):
            action = model.name.removesuffix("Item")
            context["bench_write"] = _PendingWrite((self._target(action, params),), 1)
        elif model.name == "GetItem":
            context["bench_read_consistent"] = bool(params.get("ConsistentRead"))
        elif model.name not in ("DescribeTable", "ListTables"):
            raise NotImplementedError(f"the capacity meter has no rule for {model.name}")

    def _after_call(self, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        pending: _PendingWrite | None = context.pop("bench_write", None)
        consistent: bool | None = context.pop("bench_read_consistent", None)
        ok = http_response.status_code < 300
        failed_condition = parsed.get("Error", {}).get("Code") in _CONDITION_FAILURES
        if pending is not None and (ok or failed_condition):
            units = sum(
                write_units(max(target.size_before, target.proposed_size, self._size_after(target) if ok else 0))
                for target in pending.targets
            )
            with self._lock:
                self._write_units += units * pending.factor
        if consistent is not None and ok:
            read = read_units(item_size(parsed.get("Item")), consistent=consistent)
            with self._lock:
                self._read_units += read

    # -- items --------------------------------------------------------------------

    def _target(self, action: str, request: Mapping[str, Any]) -> _Target:
        table = request["TableName"]
        if action == "Put":
            key = {name: request["Item"][name] for name in self._key_schema(table)}
            proposed = item_size(request["Item"])
        else:
            key, proposed = dict(request["Key"]), 0
        return _Target(table, key, self._size_now(table, key), proposed)

    def _size_after(self, target: _Target) -> int:
        return self._size_now(target.table, target.key)

    def _size_now(self, table: str, key: dict[str, Any]) -> int:
        with unobserved():
            response = self._reader.get_item(TableName=table, Key=key, ConsistentRead=True)
        return item_size(response.get("Item"))

    def _key_schema(self, table: str) -> tuple[str, ...]:
        if table not in self._key_names:
            with unobserved():
                schema = self._reader.describe_table(TableName=table)["Table"]["KeySchema"]
            self._key_names[table] = tuple(element["AttributeName"] for element in schema)
        return self._key_names[table]
