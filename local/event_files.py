"""Sample events (``events/*.json``, Lambda's SQS event shape) turned back into messages to send."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from testkit.messages import Outgoing


class EventFileError(ValueError):
    """An event file that is missing or is not an SQS event: one line saying which and why."""


def load_event(path: Path) -> dict[str, Any]:
    try:
        event = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EventFileError(f"no event file {path} (the samples are in events/)") from None
    except (OSError, ValueError) as error:
        raise EventFileError(f"{path} cannot be read as JSON: {error}") from None
    if not isinstance(event, dict) or not isinstance(event.get("Records"), list):
        raise EventFileError(f"{path} is not an SQS event: it has no Records list")
    return event


def sqs_message_attributes(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Lambda's lowercase attribute shape back to what ``SendMessage`` takes."""
    converted: dict[str, dict[str, Any]] = {}
    for name, value in (record.get("messageAttributes") or {}).items():
        attribute: dict[str, Any] = {"DataType": value["dataType"]}
        if value.get("binaryValue") is not None:
            attribute["BinaryValue"] = base64.b64decode(value["binaryValue"])
        else:
            attribute["StringValue"] = value.get("stringValue") or ""
        converted[name] = attribute
    return converted


def messages_from_event(path: Path) -> list[Outgoing]:
    """One message per record, with its body, message attributes and FIFO group (SQS sets the rest)."""
    return [
        Outgoing(
            body=record.get("body", ""),
            kind="from-file",
            attributes=sqs_message_attributes(record),
            group=(record.get("attributes") or {}).get("MessageGroupId"),
        )
        for record in load_event(path)["Records"]
    ]
