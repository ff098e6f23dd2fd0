"""Seed items for the refund example (``testkit.payloads`` finds this file by its event type): a refund applies only
if its account holds at least the amount, so each drawn payload's account gets exactly that balance first."""

from __future__ import annotations

from typing import Any


def seed_items(payload: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    balance = {"accountId": payload["accountId"], "entryId": "BALANCE", "balanceCents": payload["amountCents"]}
    return [("LedgerTable", balance)]
