"""Seed items for the inventory example (``testkit.payloads`` finds this file by its event type): a reservation
applies only if its SKU holds the stock asked, so each drawn payload gets exactly that stock first."""

from __future__ import annotations

from typing import Any


def seed_items(payload: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [("InventoryTable", {"sku": payload["sku"], "entryId": "STOCK", "stock": payload["quantity"]})]
