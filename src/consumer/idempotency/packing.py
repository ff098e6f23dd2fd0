"""Transitions of several messages packed into shared transactions, and each one's part of the answer read.

Transitions whose items are disjoint share a ``TransactWriteItems`` (first fit over the packs opened last, within its
100 items and 4 MB); ones that meet never do, and one packed alone goes at once to its own write, never behind a
shared transaction's send. When DynamoDB cancels a shared transaction, its reasons name the failing
items: each transition reads its own (``Transition.read``) and the others are sent again without it. Whatever a shared
transaction cannot settle (a conflict, a reason that says nothing, an error naming no item, items that meet or cannot
be built) is left to the transition's own write, with the reason; a transition that raises while reading its part
keeps that error as its own outcome, and the others keep theirs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from consumer.errors import TransientError
from consumer.idempotency.calls import Table, cancelled
from consumer.idempotency.observer import FallBack
from consumer.idempotency.transition import Transition

# TransactWriteItems' own limits: a shared transaction stays within both.
MAX_TRANSACTION_ITEMS = 100
MAX_TRANSACTION_BYTES = 4 * 1024 * 1024
# A transition is tried against the few packs opened last: first fit over every pack tried each of a batch's
# transitions against every full pack again, quadratic in the batch (10,000 messages). The packs before these are full,
# or hold an item of the ones after, which the next packs take.
_OPEN_PACKS = 4


@dataclass(frozen=True)
class Settled:
    """A transition's outcome from a shared transaction: its answer, or the error reading its part raised."""

    answer: object


@dataclass(frozen=True)
class Own:
    """A transition the shared transaction could not settle: it is to go alone, for ``reason`` (``FallBack``)."""

    reason: str


Shared = Settled | Own


def item_key(transact_item: Mapping[str, Any]) -> tuple[str, object]:
    """The item a transaction's action names: its table and key (a put's whole item, whose key the schema alone
    tells; DynamoDB refuses a transaction whose puts meet on one item, and their messages then go alone)."""
    action = next(iter(transact_item.values()))
    named = action["Key"] if "Key" in action else action["Item"]
    # Scalar attributes (a key's always, a put's mostly), in order, name the item without encoding it.
    attributes = tuple(sorted((name, *value.items()) for name, value in named.items()))
    try:
        hash(attributes)
    except TypeError:  # a put's list, set or map: its JSON names it
        return action["TableName"], json.dumps(named, sort_keys=True)
    return action["TableName"], attributes


# The size a transaction's items are packed by: their compact JSON, an estimate of DynamoDB's own measure (names and
# values, without the type tags). An update's item may be larger than its request: a shared transaction DynamoDB
# refuses for its size goes alone, as any error naming no item does.
_encode = json.JSONEncoder(check_circular=False, separators=(",", ":")).encode


def size_of(items: Sequence[Mapping[str, Any]]) -> int:
    """The bytes ``items`` count for in a shared transaction's 4 MB."""
    return len(_encode(items))


class _Pack:
    """Transitions packed into one transaction: their indexes, the items they name, their items' count and size."""

    def __init__(self) -> None:
        self.indexes: list[int] = []
        self.keys: set[tuple[str, object]] = set()
        self.count = 0
        self.size = 0

    def fits(self, keys: set[tuple[str, object]], count: int, size: int) -> bool:
        within = self.count + count <= MAX_TRANSACTION_ITEMS and self.size + size <= MAX_TRANSACTION_BYTES
        return within and not self.keys & keys

    def add(self, index: int, keys: set[tuple[str, object]], count: int, size: int) -> None:
        self.indexes.append(index)
        self.keys |= keys
        self.count += count
        self.size += size


class Packed:
    """A group's transitions packed: those that go alone, settled at once (``alone``), and the shared transactions
    (``packs``, each two transitions or more, by index), each sent by ``send`` on whichever thread its group picks."""

    def __init__(self, table: Table, transitions: Sequence[Transition[Any]]) -> None:
        self._table = table
        self._transitions = transitions
        self.alone: dict[int, Shared] = {}
        self._built: dict[int, list[dict[str, Any]]] = {}
        packs: list[_Pack] = []
        now_ms = table.now_ms()
        for index, transition in enumerate(transitions):
            try:
                items = transition.items(table, now_ms)
                keys = {item_key(item) for item in items}
                size = size_of(items)
            except Exception:  # a value DynamoDB has no type for: the message's own error, which its own write raises
                self.alone[index] = Own(FallBack.UNBUILT)
                continue
            if len(keys) < len(items) or len(items) > MAX_TRANSACTION_ITEMS:
                # Two actions on one item, or too many: the message's own write says why, in its own words.
                self.alone[index] = Own(FallBack.UNBUILT)
                continue
            pack = next((pack for pack in packs[-_OPEN_PACKS:] if pack.fits(keys, len(items), size)), None)
            if pack is None:
                pack = _Pack()
                packs.append(pack)
            pack.add(index, keys, len(items), size)
            self._built[index] = items
        self.packs = [pack.indexes for pack in packs if len(pack.indexes) > 1]
        packs_naming: Counter[tuple[str, object]] | None = None  # counted once, and only if a pack goes alone
        for pack in packs:
            if len(pack.indexes) > 1:
                continue
            if len(transitions) == 1:
                self.alone[pack.indexes[0]] = Own(FallBack.ALONE)
            else:
                packs_naming = packs_naming or Counter(key for each in packs for key in each.keys)
                self.alone[pack.indexes[0]] = Own(_alone_because(pack, packs_naming))

    def send(self, indexes: Sequence[int], settle: Callable[[Mapping[int, Shared]], None]) -> None:
        """Send one of ``packs`` as one transaction, again without each one its cancellation settles: ``settle`` is
        given each transition's outcome, by index, as soon as it is known (one a cancellation names, before the others
        are sent again)."""
        table, transitions = self._table, self._transitions
        pending = list(indexes)
        reason = FallBack.ALONE  # the others settled, one is left: its own write is as cheap
        while len(pending) > 1:
            now_ms = table.now_ms()
            # Built for the packing, sent once; an attempt after a cancellation builds them at its own time.
            parts = [self._built.pop(index, []) or transitions[index].items(table, now_ms) for index in pending]
            try:
                # A token per request: botocore's own retries of it are idempotent at DynamoDB.
                table.transact([item for part in parts for item in part], table.new_token(), messages=len(pending))
            except ClientError as error:
                reasons = list(error.response.get("CancellationReasons") or [])
                if error.response["Error"]["Code"] != "TransactionCanceledException" or len(reasons) != sum(
                    len(part) for part in parts
                ):
                    reason = FallBack.UNNAMED
                    break
                rest, named = [], {}
                for index, part in zip(pending, parts, strict=True):
                    mine, reasons = reasons[: len(part)], reasons[len(part) :]
                    outcome = _read(transitions[index], mine)
                    if outcome is None:
                        rest.append(index)
                    else:
                        named[index] = outcome
                if len(rest) == len(pending):
                    # No item named: the same transaction would be cancelled again. Alone, each meets it in its own
                    # words.
                    reason = FallBack.UNNAMED
                    break
                settle(named)
                pending = rest
            except Exception:  # an error naming no item: each message's own write finds what landed
                reason = FallBack.UNNAMED
                break
            else:
                settle(
                    {
                        index: Settled(transitions[index].landed(part))
                        for index, part in zip(pending, parts, strict=True)
                    }
                )
                return
        settle(dict.fromkeys(pending, Own(reason)))


def _alone_because(pack: _Pack, packs_naming: Mapping[tuple[str, object], int]) -> str:
    """Why a transition packed alone, beside others, goes alone: its items meet another's (an item another pack names
    too: ``packs_naming`` counts the packs naming each), or no room."""
    return FallBack.SHARES_AN_ITEM if any(packs_naming[key] > 1 for key in pack.keys) else FallBack.NO_ROOM


def _read(transition: Transition[Any], reasons: Sequence[Mapping[str, Any]]) -> Shared | None:
    """A transition's outcome from its items' cancellation reasons: None when none of them failed."""
    try:
        answer = cancelled(transition.writes(), reasons, holder=None)
    except TransientError:  # a conflict, or a reason that settles nothing: its own write retries it
        return Own(FallBack.NAMED)
    except Exception as error:  # reading its part failed (a record this version cannot read): its own outcome
        return Settled(error)
    if answer is None:
        return None
    try:
        read = transition.read(answer)
    except Exception as error:
        return Settled(error)
    return Own(FallBack.NAMED) if read is None else Settled(read)
