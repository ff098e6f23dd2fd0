"""Files turned into messages to send: SQS events (``events/*.json``) and bodies files (one body a line)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from testkit.messages import Outgoing


class EventFileError(ValueError):
    """A file to send or invoke that is missing or malformed: one line saying which and why."""


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


def messages_from_bodies(path: Path) -> list[Outgoing]:
    """One message per line that is not blank, its body the line as written; one bad line and none is sent."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError) as error:
        raise EventFileError(f"{path} cannot be read: {error}") from None
    for number, line in enumerate(lines, 1):
        try:
            if line.strip():
                json.loads(line)
        except ValueError as error:
            raise EventFileError(f"{path} line {number} is not a JSON body: {error}") from None
    return [Outgoing(body=line, kind="from-file") for line in lines if line.strip()]


EVENTS = Path(__file__).resolve().parent.parent / "events"


def sample_bodies(event_type: str, events: Path = EVENTS) -> list[str]:
    """The bodies of the sample events (``events/*.json``, SQS events as Lambda delivers them) of this event type,
    in file order; poison samples included (a body the model refuses, a key reused)."""
    bodies = [record["body"] for path in sorted(events.glob("*.json")) for record in load_event(path)["Records"]]
    return [body for body in bodies if Outgoing(body, "from-file").event_type == event_type]
