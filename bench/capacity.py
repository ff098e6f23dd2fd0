"""Read and write capacity units from item sizes, by DynamoDB's published rules (see methodology.md).

moto reports a constant ``ConsumedCapacity`` and DynamoDB Local none, so the meter reads each targeted item before and
after a write, through its own client outside the counted calls; that assumes no other writer touches the item in
between, true of the benchmark's records (every key and account unique). A write consumes the units of the larger item,
also for a failed condition (the existing against the proposed one); every action of a transaction, ``ConditionCheck``
included, costs twice that, and a cancelled one is charged as if every action had been attempted (AWS does not say: an
upper bound). A read is charged also when there is no item.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from typing import Any

from bench.probe import HandlerSpec, observed, unobserved

WRITE_UNIT_BYTES = 1024
READ_UNIT_BYTES = 4096
TRANSACTION_FACTOR = 2
_CONDITION_FAILURES = frozenset({"ConditionalCheckFailedException", "TransactionCanceledException"})


def number_size(text: str) -> int:
    mantissa = text.lstrip("+-").lower().split("e", 1)[0]
    digits = mantissa.replace(".", "").strip("0")
    return (len(digits) + 1) // 2 + 1


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8"))


# The scalar types by their size; a set (SS, NS, BS) is the sum of its members'.
_SCALAR_SIZES: dict[str, Callable[[Any], int]] = {
    "S": _utf8_size,
    "N": number_size,
    "B": len,
    "BOOL": lambda _: 1,
    "NULL": lambda _: 1,
}


def value_size(value: Mapping[str, Any]) -> int:
    """Size in bytes of one low-level attribute value such as ``{"S": "abc"}``."""
    ((kind, raw),) = value.items()
    if kind in _SCALAR_SIZES:
        return _SCALAR_SIZES[kind](raw)
    if kind in ("SS", "NS", "BS"):
        return sum(_SCALAR_SIZES[kind[0]](member) for member in raw)
    if kind == "L":
        return 3 + sum(1 + value_size(member) for member in raw)
    if kind == "M":
        return 3 + sum(1 + _utf8_size(name) + value_size(member) for name, member in raw.items())
    raise ValueError(f"unknown attribute type {kind!r}")


def item_size(item: Mapping[str, Mapping[str, Any]] | None) -> int:
    return sum(_utf8_size(name) + value_size(value) for name, value in (item or {}).items())


def write_units(size_bytes: int) -> int:
    return max(1, math.ceil(size_bytes / WRITE_UNIT_BYTES))


def read_units(size_bytes: int, *, consistent: bool) -> float:
    units = max(1, math.ceil(size_bytes / READ_UNIT_BYTES))
    return float(units) if consistent else units / 2


# A write's item: its table, its key, and the larger of its size before the write and of the item a Put proposes.
_Target = tuple[str, dict[str, Any], int]


class CapacityMeter:
    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self._lock = threading.Lock()
        self._key_names: dict[str, tuple[str, ...]] = {}
        self.write_units = 0.0
        self.read_units = 0.0

    def handler_specs(self) -> list[HandlerSpec]:
        return [("before-parameter-build.dynamodb", self._before_call), ("after-call.dynamodb", self._after_call)]

    def _before_call(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        if not observed():
            return
        if model.name == "TransactWriteItems":
            # Each entry holds exactly one action: Put, Update, Delete or ConditionCheck.
            targets = [self._target(action, spec) for item in params["TransactItems"] for action, spec in item.items()]
            context["bench_write"] = (targets, TRANSACTION_FACTOR)
        elif model.name in ("PutItem", "UpdateItem", "DeleteItem"):
            context["bench_write"] = ([self._target(model.name.removesuffix("Item"), params)], 1)
        elif model.name == "GetItem":
            context["bench_read_consistent"] = bool(params.get("ConsistentRead"))
        elif model.name not in ("DescribeTable", "ListTables"):
            raise NotImplementedError(f"the capacity meter has no rule for {model.name}")

    def _after_call(self, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        write: tuple[list[_Target], int] | None = context.pop("bench_write", None)
        consistent: bool | None = context.pop("bench_read_consistent", None)
        ok = http_response.status_code < 300
        failed_condition = parsed.get("Error", {}).get("Code") in _CONDITION_FAILURES
        if write is not None and (ok or failed_condition):
            targets, factor = write
            units = sum(write_units(max(size, self._size(table, key) if ok else 0)) for table, key, size in targets)
            with self._lock:
                self.write_units += units * factor
        if consistent is not None and ok:
            read = read_units(item_size(parsed.get("Item")), consistent=consistent)
            with self._lock:
                self.read_units += read

    def _target(self, action: str, request: Mapping[str, Any]) -> _Target:
        table = request["TableName"]
        if action == "Put":
            key = {name: request["Item"][name] for name in self._key_schema(table)}
            return table, key, max(self._size(table, key), item_size(request["Item"]))
        key = dict(request["Key"])
        return table, key, self._size(table, key)

    def _size(self, table: str, key: dict[str, Any]) -> int:
        with unobserved():
            response = self._reader.get_item(TableName=table, Key=key, ConsistentRead=True)
        return item_size(response.get("Item"))

    def _key_schema(self, table: str) -> tuple[str, ...]:
        if table not in self._key_names:
            with unobserved():
                schema = self._reader.describe_table(TableName=table)["Table"]["KeySchema"]
            self._key_names[table] = tuple(element["AttributeName"] for element in schema)
        return self._key_names[table]
