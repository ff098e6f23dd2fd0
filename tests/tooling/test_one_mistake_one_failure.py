"""One mistake, one failure: each mistake a user is known to make, planted in a copy of the project, stops `make
static` (make test's static stage) with one failure, in the words of its cause: never a second failure that follows
from it, never a wrong advice, never a self-check of the checks themselves.

Each run is a whole static stage (about half a minute), so these run in make proof, with the checks' other tests:
make test runs the static stage once, on the user's own project."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit import application
from testkit.template import TEMPLATE_PATH
from tests.tooling.template_copies import run_in, template_project

_LIMIT_S = 600
# Generous: the servers start, the function is checked, and the command stops (seconds on an idle machine).
_START_DEADLINE_S = 60
PAYMENT = application.handlers_folder(Path()) / "payment_received.py"
RECEIPT = application.handlers_folder(Path()) / "receipt_requested.py"
RECEIPT_PARAMETER = "  ReceiptWebhookUrl:  # example: receipt\n"


def _line_of(text: str) -> int:
    """The line ``text`` starts on in template.yaml."""
    source = TEMPLATE_PATH.read_text(encoding="utf-8")
    return source[: source.index(text)].count("\n") + 1


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{path.name} changed: {old!r} is not in it once; update this test"
    path.write_text(text.replace(old, new), encoding="utf-8")


def guard_on_an_optimistic_handler(root: Path) -> None:
    """README warns of it: an optimistic handler's conditions go in its writes, a guard would never run. Its check
    would ask for a grant (ConditionCheckItem) and the local stack would wait on a function that cannot start."""
    _edit(root / PAYMENT, "import ID_PATTERN, Effect,", "import ID_PATTERN, ConditionCheck, Effect, Guard,")
    _edit(
        root / PAYMENT,
        "    def handle(self, payload: PaymentReceived, context: MessageContext) -> Effect:\n",
        "    def guard(self, payload: PaymentReceived, context: MessageContext) -> Guard | None:\n"
        '        key = {"accountId": payload.accountId, "entryId": "BALANCE"}\n'
        '        check = ConditionCheck(self.table_names["LedgerTable"], key, "attribute_exists(accountId)")\n'
        "        return Guard(writes=(check,))\n\n"
        "    def handle(self, payload: PaymentReceived, context: MessageContext) -> Effect:\n",
    )


def unregistered_handler(root: Path) -> None:
    """A handler file with its variables and secret in the template, left out of HANDLERS."""
    _edit(
        application.registry_file(root),
        "(PaymentReceivedHandler, ReceiptRequestedHandler)",
        "(PaymentReceivedHandler,)",
    )
    _edit(
        application.registry_file(root), application.handler_import("receipt_requested", "ReceiptRequestedHandler"), ""
    )


def missing_grant(root: Path) -> None:
    ledger = "                  - dynamodb:UpdateItem\n                Resource: !GetAtt LedgerTable.Arn\n"
    _edit(root / "template.yaml", "                  - dynamodb:PutItem\n" + ledger, ledger)


def required_setting_missing(root: Path) -> None:
    """README's required setting, without its variable in the template."""
    _edit(
        root / RECEIPT,
        '    receipt_webhook_url: ApiUrl = ""\n',
        '    receipt_webhook_url: ApiUrl = ""\n    billing_url: str\n',
    )


def parameter_without_default(root: Path) -> None:
    """README's required setting given by a parameter, without a Default."""
    required_setting_missing(root)
    _edit(
        root / "template.yaml",
        "  ReceiptWebhookUrl:  # example: receipt\n",
        "  BillingUrl:\n    Type: String\n  ReceiptWebhookUrl:  # example: receipt\n",
    )
    _edit(
        root / "template.yaml",
        "          RECEIPT_WEBHOOK_URL: !Ref ReceiptWebhookUrl  # example: receipt\n",
        "          RECEIPT_WEBHOOK_URL: !Ref ReceiptWebhookUrl  # example: receipt\n"
        "          BILLING_URL: !Ref BillingUrl\n",
    )


def required_setting_empty_at_the_defaults(root: Path) -> None:
    """README's required setting given by a parameter whose Default leaves it empty: the function cannot start."""
    parameter_without_default(root)
    _edit(
        root / "template.yaml",
        "  BillingUrl:\n    Type: String\n",
        '  BillingUrl:\n    Type: String\n    Default: ""\n',
    )


def table_not_in_the_template(root: Path) -> None:
    _edit(
        root / PAYMENT,
        'tables: ClassVar[tuple[str, ...]] = ("LedgerTable",)',
        'tables: ClassVar[tuple[str, ...]] = ("LedgerTable", "OrdersTable")',
    )


def destination_not_in_the_template(root: Path) -> None:
    """A handler's destination, declared as its tables are, that the template lacks: its variable and its grant are
    the relay's checks' to name once it is there."""
    declared = 'destinations: ClassVar[tuple[str, ...]] = ("ConsumerQueue",)'
    _edit(root / PAYMENT, declared, declared.replace('"ConsumerQueue",', '"ConsumerQueue", "ReceiptQueue"'))


# Each mistake and the one failure it gives: the test's name, and its words.
MISTAKES: dict[Callable[[Path], None], tuple[str, str]] = {
    guard_on_an_optimistic_handler: (
        "test_the_function_starts",
        "the function cannot start: consumer.errors.ConfigurationError: handler of PaymentReceived defines a guard,"
        " which only lock mode runs",
    ),
    unregistered_handler: (
        "test_every_handler_file_is_registered_in_handlers",
        f"register each handler file in HANDLERS ({application.registry_file(Path())}): ReceiptRequestedHandler is"
        " left out",
    ),
    missing_grant: (
        "test_role_grants_exactly_what_the_code_calls",
        "missing grant: ApplyLedgerWrites needs dynamodb:PutItem on LedgerTable",
    ),
    required_setting_missing: (
        "test_environment_is_what_the_code_reads",
        'ConsumerFunction\'s Environment.Variables lacks BILLING_URL: add "BILLING_URL: <value>" under it',
    ),
    parameter_without_default: (
        "test_every_parameter_has_a_value_for_the_checks",
        'parameter BillingUrl has no Default: for make test and the local stack, add "BillingUrl: <value>" under'
        " LocalParameters: in the template's Metadata",
    ),
    required_setting_empty_at_the_defaults: (
        "test_the_function_starts",
        "the function cannot start: consumer.errors.ConfigurationError: environment variable BILLING_URL is required"
        " and is empty or unset",
    ),
    table_not_in_the_template: (
        "test_each_table_a_handler_declares_is_a_template_table_or_given_by_its_parameter",
        "a handler declares OrdersTable: add an AWS::DynamoDB::Table of that name to template.yaml, or a parameter"
        " ExistingOrdersTable naming an existing table",
    ),
    destination_not_in_the_template: (
        "test_each_destination_a_handler_declares_is_a_queue_topic_or_bus_of_the_template",
        "a handler declares ReceiptQueue as a destination: add an AWS::SQS::Queue, AWS::SNS::Topic or"
        " AWS::Events::EventBus of that name to template.yaml",
    ),
}


@pytest.mark.long(40)
@pytest.mark.parametrize("plant", MISTAKES, ids=lambda plant: plant.__name__)
def test_a_planted_mistake_stops_the_static_stage_with_one_failure_in_its_own_words(
    tmp_path: Path, plant: Callable[[Path], None]
) -> None:
    root = template_project(tmp_path)
    plant(root)
    # As make test runs it (the venv taken as built: this very test runs in it).
    done = run_in(root, ["make", "--no-print-directory", "-o", ".venv/.installed", "static"])
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-4000:]
    failed = re.findall(r"^(?:FAILED|ERROR) \S+::(\w+)", output, re.MULTILINE)
    test, words = MISTAKES[plant]
    assert failed == [test], output[-4000:]
    assert words in output, output[-4000:]


@pytest.mark.long(30)
@pytest.mark.parametrize("command", ["demo", "smoke", "run"])
def test_a_local_stack_whose_function_cannot_start_stops_at_once_with_the_start_error(
    tmp_path: Path, command: str
) -> None:
    # The start is checked before any poller starts, so no command waits on a function that cannot start (make demo
    # used to wait at "0 of 18 done" while the cause was only in its function log).
    root = template_project(tmp_path)
    guard_on_an_optimistic_handler(root)
    started = time.monotonic()
    done = run_in(root, [sys.executable, "-m", "local", command])
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    said = (
        "error: the function cannot start: consumer.errors.ConfigurationError: handler of PaymentReceived defines a"
        " guard, which only lock mode runs"
    )
    assert said in done.stderr, done.stderr[-4000:]
    assert time.monotonic() - started < _START_DEADLINE_S
