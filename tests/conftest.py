"""Root fixtures: the local stack's servers, started once per session and always stopped.

Tests that use them are marked ``integration`` automatically, so ``pytest -m "not
integration"`` runs without Java or the npm install.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import botocore.loaders
import botocore.session
import pytest
from hypothesis import settings

from local.stack import DeployedStack, deploy_stack
from testkit.conflict_emulation import ConflictEmulation
from testkit.dynamodb_local import DynamoDBLocal
from testkit.servers import LocalServers
from testkit.tables import IDEMPOTENCY_TABLE, create_template_tables
from testkit.webhook import WebhookSink
from tests.tooling import ON_THE_CORES_OWN

# The test kit for handlers (tests/kit.py): its fixtures serve every test, a user's too.
pytest_plugins = ["tests.kit"]

_INTEGRATION_FIXTURES = frozenset({"dynamodb_local", "local_servers", "make_stack", "stack"})


def _one_data_loader() -> None:
    """Every botocore session of the test process shares one loader of the SDK's service models, as one
    Lambda environment's clients share one session: a new session reads the same JSON files again (about half
    of a unit test's time). What the loader holds is the installed SDK's data, read-only; nothing else is shared."""
    loader = functools.cache(botocore.loaders.create_loader)

    def register(session: botocore.session.Session) -> None:
        session.lazy_register_component("data_loader", lambda: loader(session.get_config_variable("data_path")))

    botocore.session.Session._register_data_loader = register  # type: ignore[attr-defined]


_one_data_loader()

# A property test draws the same examples on every run, so a result of `make test` or `make proof` never depends on
# a draw; `make fuzz` goes further, 7,000 batches from the seeds it names on its command lines.
settings.register_profile("make-test", derandomize=True)
settings.load_profile("make-test")


# A test's property of this name is printed at the end of the run, passed or not (xdist carries it back).
SHOWN = "shown"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        for name, value in getattr(report, "user_properties", ()):
            if name == SHOWN and report.when == "call":
                terminalreporter.write_line(f"{report.nodeid}: {value}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _INTEGRATION_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    # A tooling module that runs the registered application runs on the core's own, by one test of the checkout's.
    there = bool(os.environ.get(ON_THE_CORES_OWN))
    kept: list[pytest.Item] = []
    elsewhere: list[pytest.Item] = []
    for item in items:
        run = item.get_closest_marker("cores_own_application_run") is not None
        moved = (run and there) or (not run and not there and item.get_closest_marker("cores_own_application"))
        (elsewhere if moved else kept).append(item)
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = kept
    # Longest first: make test and make proof deal whole files to the workers in this order (--dist loadfile), so the
    # files with the long tests start first, each on the next free worker, and the short files fill in behind them.
    items.sort(key=_expected_seconds, reverse=True)


def _expected_seconds(item: pytest.Item) -> float:
    marker = item.get_closest_marker("long")
    return 0 if marker is None else float(marker.args[0]) if marker.args else 10


@pytest.fixture(scope="session")
def dynamodb_local() -> Iterator[DynamoDBLocal]:
    """Amazon's DynamoDB Local, in memory on 127.0.0.1; ``.endpoint_url``, ``.client()``.

    Always behind the conflict emulation, whatever the environment says: no concurrency test
    may pass only because DynamoDB Local serialises transactions.
    """
    with DynamoDBLocal(emulation=ConflictEmulation()) as server:
        yield server


@pytest.fixture(scope="session")
def local_servers(dynamodb_local: DynamoDBLocal) -> Iterator[LocalServers]:
    """DynamoDB Local and moto's SQS server, both on loopback, shared by the session.

    ``.dynamodb_endpoint_url``, ``.sqs_endpoint_url``, ``.client("sqs"|"dynamodb")``, and
    ``.deploy(stack_name=..., parameter_overrides=...)``, which creates the template's
    queues and tables under a fresh stack name so tests never see each other's data.
    """
    with LocalServers(dynamodb=dynamodb_local) as servers:
        yield servers


@pytest.fixture
def local_aws(local_servers: LocalServers, monkeypatch: pytest.MonkeyPatch) -> LocalServers:
    """The local servers, with this process's AWS variables pointing boto3 at them (as the function's are)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", local_servers.dynamodb_endpoint_url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", local_servers.sqs_endpoint_url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "local")
    return local_servers


@pytest.fixture(scope="session")
def webhook_sink() -> Iterator[WebhookSink]:
    """The receipt webhook sink on loopback; cleared before each test that deploys a stack."""
    with WebhookSink() as sink:
        yield sink


@pytest.fixture
def webhook() -> Iterator[WebhookSink]:
    """A receipt webhook sink of this test's own, on loopback."""
    with WebhookSink() as sink:
        yield sink


@pytest.fixture
def make_stack(local_servers: LocalServers, webhook_sink: WebhookSink) -> Iterator[Callable[..., DeployedStack]]:
    """Deploy the template afresh (new names, empty tables and queues) with the function active.

    ``make_stack(parameter_overrides={...}, template_path=...)``; ``.pollers(n)`` consumes
    the queue as Lambda would. Pollers stop and the function's environment is restored at
    teardown. One deployed stack's function is active at a time (the environment is
    process-wide).
    """
    deployed: list[DeployedStack] = []
    webhook_sink.clear()

    def make(**options: Any) -> DeployedStack:
        for previous in deployed:
            previous.stop()
        stack = deploy_stack(local_servers, webhook=webhook_sink, **options)
        deployed.append(stack)
        return stack

    yield make
    for stack in deployed:
        stack.stop()


@pytest.fixture
def stack(make_stack: Callable[..., DeployedStack]) -> DeployedStack:
    """The template with its defaults, deployed afresh for this test."""
    return make_stack()


TableFactory = Callable[[str], str]


@pytest.fixture(scope="module")
def id_table(dynamodb_local: DynamoDBLocal) -> Iterator[TableFactory]:
    """``id_table(prefix)`` creates a table shaped as the template's idempotency table (partition key ``id``)."""
    client = dynamodb_local.client()
    made: list[str] = []

    def create(prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        create_template_tables(client, {IDEMPOTENCY_TABLE: name})
        made.append(name)
        return name

    yield create
    for name in made:
        client.delete_table(TableName=name)
