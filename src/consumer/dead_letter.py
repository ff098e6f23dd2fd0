"""Send poison messages to the dead-letter queue with the reason attached.

Characters SQS refuses (in the body only possible in a direct invocation; in the
reason whenever it echoes a field name) are replaced by U+FFFD, in the body counted
in ``BodyCharactersReplaced``; original attributes SQS would
refuse (a name, type or value it never delivers) are left behind.

SQS counts the body and every attribute (name, type and value) toward its 1 MiB
message limit, so a poison message near that size cannot carry its reason as is.
What gives way, in order: the original message attributes (their names are listed
in ``DroppedAttributes``), then the body's tail (``BodyTruncated`` gives the
original size and SHA-256). The reason itself always fits.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from consumer.envelope import MAX_BODY_BYTES, SqsMessage, bounded, message_attributes, sqs_text
from consumer.errors import ErrorType

if TYPE_CHECKING:
    from types_boto3_sqs import SQSClient
    from types_boto3_sqs.type_defs import MessageAttributeValueTypeDef

    from consumer.prepared import Prepared

# SQS allows 10 message attributes; ours take up to 7, the original ones fill the rest.
_MAX_ATTRIBUTES = 10
# The whole message, body and attributes, as SQS counts it.
MAX_MESSAGE_BYTES = MAX_BODY_BYTES
_OURS = frozenset(
    {
        "ErrorType",
        "ErrorMessage",
        "OriginalMessageId",
        "IdempotencyKey",
        "DroppedAttributes",
        "BodyTruncated",
        "BodyCharactersReplaced",
    }
)


# What SQS accepts as an attribute name and data type; SQS itself never delivers others.
_ATTRIBUTE_NAME = re.compile(r"^(?!\.)(?!.*\.\.)(?!(?i:aws\.|amazon\.))[A-Za-z0-9_.-]{1,256}(?<!\.)$")
_DATA_TYPE = re.compile(r"^(String|Number|Binary)(\.[A-Za-z0-9_.-]{1,200})?$")


def _utf8(text: str) -> bytes:
    # A lone surrogate cannot reach SQS; measure it as SQS would see its replacement.
    return text.encode("utf-8", "replace")


def message_size(body: str, attributes: Mapping[str, MessageAttributeValueTypeDef]) -> int:
    """Bytes SQS counts toward its limit: the body, and each attribute's name, type and value."""
    return len(_utf8(body)) + _attributes_size(attributes)


def _attributes_size(attributes: Mapping[str, MessageAttributeValueTypeDef]) -> int:
    size = 0
    for name, value in attributes.items():
        payload = value.get("StringValue")
        payload_bytes = _utf8(payload) if isinstance(payload, str) else bytes(value.get("BinaryValue", b""))  # type: ignore[arg-type]
        size += len(_utf8(name)) + len(_utf8(value["DataType"])) + len(payload_bytes)
    return size


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class DeadLetterQueue:
    def __init__(self, client: Callable[[], SQSClient], queue_url: str) -> None:
        # A getter: the client is only created when the first poison message needs it.
        self._client = client
        self._url = queue_url
        self._fifo = queue_url.endswith(".fifo")

    def send(self, item: Prepared, error_type: ErrorType | str, error_message: str) -> None:
        """Send the original body with ``ErrorType`` and ``ErrorMessage``; raises on failure."""
        sqs_message, message_id = item.original, item.message_id or "(none)"
        # The reason may echo outside text (a field name, an exception): SQS would refuse the whole send.
        reason = bounded(error_message) or error_type
        ours: dict[str, MessageAttributeValueTypeDef] = {
            "ErrorType": {"DataType": "String", "StringValue": str(error_type)},
            "ErrorMessage": {"DataType": "String", "StringValue": reason},
            "OriginalMessageId": {"DataType": "String", "StringValue": message_id},
        }
        if item.idempotency_key:
            ours["IdempotencyKey"] = {"DataType": "String", "StringValue": item.idempotency_key}
        body = sqs_message.get("body")
        # SQS refuses an empty body; an empty or non-text original is still worth keeping.
        body = body if isinstance(body, str) and body else f"({'empty body' if not body else type(body).__name__})"
        # SQS never delivers such characters, but a direct invocation can: keep the rest.
        body, replaced = sqs_text(body)
        if replaced:
            ours["BodyCharactersReplaced"] = {"DataType": "Number", "StringValue": str(replaced)}
        originals = self._original_attributes(sqs_message, _MAX_ATTRIBUTES - len(ours))
        body, attributes = self._fit(body, originals, ours)
        request: dict[str, Any] = {"QueueUrl": self._url, "MessageBody": body, "MessageAttributes": attributes}
        if self._fifo:
            request["MessageGroupId"] = item.group or "dead-letter"
            request["MessageDeduplicationId"] = message_id[:128]
        self._client().send_message(**request)

    @staticmethod
    def _fit(
        body: str,
        originals: dict[str, MessageAttributeValueTypeDef],
        ours: dict[str, MessageAttributeValueTypeDef],
    ) -> tuple[str, dict[str, MessageAttributeValueTypeDef]]:
        # The body is encoded once: it may be a megabyte, the attributes are small.
        original = _utf8(body)
        attributes = {**originals, **ours}
        if len(original) + _attributes_size(attributes) <= MAX_MESSAGE_BYTES:
            return body, attributes
        attributes = dict(ours)
        if originals:
            attributes["DroppedAttributes"] = {"DataType": "String", "StringValue": ",".join(sorted(originals))[:1000]}
        if len(original) + _attributes_size(attributes) <= MAX_MESSAGE_BYTES:
            return body, attributes
        attributes["BodyTruncated"] = {
            "DataType": "String",
            "StringValue": f"{len(original)} bytes, sha256:{hashlib.sha256(original).hexdigest()}",
        }
        room = MAX_MESSAGE_BYTES - _attributes_size(attributes)
        return original[:room].decode("utf-8", "ignore"), attributes

    @staticmethod
    def _original_attributes(sqs_message: SqsMessage, room: int) -> dict[str, MessageAttributeValueTypeDef]:
        kept: dict[str, MessageAttributeValueTypeDef] = {}
        for name, value in message_attributes(sqs_message).items():
            if len(kept) >= room or name in _OURS:
                continue
            data_type = value.get("dataType", "String")
            if not isinstance(data_type, str) or not _DATA_TYPE.match(data_type) or not _ATTRIBUTE_NAME.match(name):
                continue
            if data_type.startswith("Binary"):
                try:
                    # Lambda hands binary attributes over base64-encoded; boto3 wants bytes.
                    kept[name] = {"DataType": data_type, "BinaryValue": base64.b64decode(value["binaryValue"])}
                except (KeyError, TypeError, ValueError, binascii.Error):
                    continue
            elif isinstance(value.get("stringValue"), str) and value["stringValue"]:
                text, replaced = sqs_text(value["stringValue"])
                if not replaced and (not data_type.startswith("Number") or _is_number(text)):
                    kept[name] = {"DataType": data_type, "StringValue": text}
        return kept
