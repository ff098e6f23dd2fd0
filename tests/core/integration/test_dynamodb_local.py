"""The DynamoDB Local launcher: loopback only, faithful conditional writes, nothing left running."""

from __future__ import annotations

import os
import socket

import pytest
from botocore.exceptions import ClientError

from testkit import dynamodb_local
from testkit.dynamodb_local import DynamoDBLocal, JavaNotFound, java_runtime
from testkit.processes import LOOPBACK
from tests.conftest import TableFactory

pytestmark = pytest.mark.integration


def _other_address() -> str | None:
    """An address of this machine other than loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_listens_on_loopback_only(dynamodb_local: DynamoDBLocal) -> None:
    assert dynamodb_local.proxy is not None
    assert dynamodb_local.direct_endpoint_url == f"http://{LOOPBACK}:{dynamodb_local.port}"
    assert dynamodb_local.endpoint_url == f"http://{LOOPBACK}:{dynamodb_local.proxy.port}"
    other = _other_address()
    if other is None:
        pytest.skip("this machine has no address besides loopback")
    for port in (dynamodb_local.port, dynamodb_local.proxy.port):
        with socket.socket() as attempt:
            attempt.settimeout(2)
            assert attempt.connect_ex((other, port)) != 0


def test_failed_condition_returns_the_old_item(dynamodb_local: DynamoDBLocal, id_table: TableFactory) -> None:
    client = dynamodb_local.client()
    table = id_table("t")
    client.put_item(TableName=table, Item={"id": {"S": "k"}, "owner": {"S": "first"}})
    with pytest.raises(ClientError) as failed:
        client.put_item(
            TableName=table,
            Item={"id": {"S": "k"}, "owner": {"S": "second"}},
            ConditionExpression="attribute_not_exists(id)",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    assert failed.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    # DynamoDB returns the item with the error (ALL_OLD); botocore's error type does not declare it.
    assert failed.value.response["Item"]["owner"] == {"S": "first"}  # type: ignore[typeddict-item]


def test_stop_ends_the_process() -> None:
    server = DynamoDBLocal().start()
    pid = server.pid
    assert pid is not None
    server.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert server.pid is None


def test_missing_java_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    java_runtime.cache_clear()
    monkeypatch.setenv("PATH", "/nonexistent")
    try:
        with pytest.raises(JavaNotFound, match="openjdk-17-jre-headless"):
            DynamoDBLocal().start()
    finally:
        monkeypatch.undo()
        java_runtime.cache_clear()


def test_a_runtime_without_jdk_compiler_is_refused_rather_than_listening_on_all_interfaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dynamodb_local, "java_runtime", lambda: ("java", False))
    with pytest.raises(JavaNotFound, match=r"jdk\.compiler"):
        DynamoDBLocal().start()
