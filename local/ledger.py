"""What the example ledger holds on a deployed stack: balances and entries, read back to check runs.

Apart from ``local.demo`` so that commands reading it (``make hot``) do not import the consumer.
"""

from __future__ import annotations

from local.stack import DeployedStack


def ledger_totals(stack: DeployedStack) -> tuple[dict[str, int], int, int]:
    """Balances per account, the number of payment entries and of receipt entries."""
    dynamodb = stack.servers.client("dynamodb")
    balances: dict[str, int] = {}
    payments = receipts = 0
    pages = dynamodb.get_paginator("scan").paginate(TableName=stack.table_name("LedgerTable"))
    for item in (item for page in pages for item in page["Items"]):
        entry = item["entryId"]["S"]
        if entry == "BALANCE":
            balances[item["accountId"]["S"]] = int(item["balanceCents"]["N"])
        payments += entry.startswith("PAYMENT#")
        receipts += entry.startswith("RECEIPT#")
    return balances, payments, receipts
