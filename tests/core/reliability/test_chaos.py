"""The fault-injection harness, short, on the core's own handlers alone (an optimistic one, a lock-mode one calling
out, a guarded lock-mode one), never the application's: the proof holds whatever a user registers. With every fault
on, the real consumer keeps every invariant, its transitions grouped or each alone; pointed at consumers that get it
wrong, the same harness reports violations (a harness that cannot fail proves nothing)."""

from __future__ import annotations

import importlib
import json
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chaos import harness
from chaos.faults import FaultKind
from chaos.harness import ChaosConfig, ChaosReport, run
from chaos.invariants import Checker, scan
from chaos.report import render
from chaos.runtime_handler import WEBHOOK_VARIABLE, Environment
from consumer.config import table_variable
from consumer.handler import MessageHandler, declared_tables
from testkit.aws import DUMMY_CREDENTIALS_ENV
from testkit.servers import LocalServers
from testkit.tables import IDEMPOTENCY_TABLE
from tests.conftest import SHOWN
from tests.core.chaos_handlers import CallOnTheSink, ChainedNotice, GuardedPeriod, LockedChainedNotice
from tests.core.handlers import TABLE_PROPERTIES, TALLY_EVENT, TALLY_TABLE, TallyHandler, tally_total


def _named(handler: type[MessageHandler[Any]]) -> str:
    return f"{handler.__module__}:{handler.__name__}"


GUARDED = _named(GuardedPeriod)
CHAIN = (_named(ChainedNotice), _named(LockedChainedNotice))
# The relay's own: a crash after a send, and its sends throttled or their answers lost.
_ON_THE_RELAY = (FaultKind.RELAY_CRASH, FaultKind.THROTTLED, FaultKind.LOST_ANSWER)
# Short, at the default rates, and every kind of fault forced once in each execution environment (at its first
# opportunity, whatever the draws): whether the run meets every kind never depends on luck. The crashes, zombies and
# slow handlers land on the guarded handler's messages: before its call (after the claim) and after it, the forced
# crashes at the commit while other lock handlers run, the forced slow handler beside quick ones.
SHORT = ChaosConfig(
    seed=20240917,
    messages=160,
    pollers=3,
    forced=dict.fromkeys(FaultKind, 1),
    registered=False,
    # The chained notices emit tally messages through the outbox, relayed back to the same consumer.
    handlers=(_named(TallyHandler), _named(CallOnTheSink), GUARDED, *CHAIN),
    table_properties=TABLE_PROPERTIES,
    forced_on=GuardedPeriod.event_type,
    # Generous: under a loaded CI machine (two test workers) draining takes longer, and a timeout proves nothing.
    drain_timeout_s=180,
)
_ON_THE_GUARDED = (
    FaultKind.CRASH_AFTER_CLAIM,
    FaultKind.CRASH_BEFORE_COMMIT,
    FaultKind.CRASH_AFTER_COMMIT,
    FaultKind.SLOW_HANDLER,
)
REPEATS = "webhook: no call repeated that alone would not repeat"


def _violations(report: ChaosReport) -> dict[str, int]:
    return {verdict.name: verdict.violations for verdict in report.verdicts}


def _handler_tables_of_the_run(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    """The tables each run makes for its handlers, by logical id, as the harness names them."""
    made: list[dict[str, str]] = []
    original = harness._handler_tables

    def remembered(*args: Any) -> dict[str, str]:
        made.append(original(*args))
        return made[-1]

    monkeypatch.setattr(harness, "_handler_tables", remembered)
    return made


@pytest.mark.long(75)
@pytest.mark.parametrize("group_commit", [True, False], ids=["grouped", "alone"])
def test_every_fault_on_and_every_invariant_holds(
    local_servers: LocalServers,
    record_property: Callable[[str, object], None],
    monkeypatch: pytest.MonkeyPatch,
    group_commit: bool,
) -> None:
    made = _handler_tables_of_the_run(monkeypatch)
    report = run(replace(SHORT, group_commit=group_commit), local_servers)
    table = render(report)
    print(table)
    injected = ", ".join(f"{kind.value} {report.history.faults[kind]}" for kind in FaultKind)
    shown = f"short chaos run, group commit {'on' if group_commit else 'off'}, seed {SHORT.seed}"
    record_property(SHOWN, f"{shown}, {report.duration_s:.0f} s, faults injected: {injected}")
    assert report.violations == 0, table
    missing = [kind.value for kind in FaultKind if report.history.faults[kind] == 0]
    assert not missing, f"faults never injected, so never tested: {missing}\n{table}"
    # A forced crash ends an invocation under way: its batch comes back.
    assert report.history.crashed > 0 and report.history.redelivered_records > 0, table
    guarded = [
        faults
        for record, faults in report.history.faults_by_record.items()
        if record.startswith(f"{GuardedPeriod.event_type}#")
    ]
    missed = [kind.value for kind in _ON_THE_GUARDED if not any(faults[kind] for faults in guarded)]
    assert not missed, f"the guarded handler never met {missed}\n{table}"
    assert report.history.crashes_in_a_wave > 0, f"no crash while other lock handlers ran\n{table}"
    # The chain: every emitted message relayed through crashes, throttles and lost answers, and applied downstream.
    relay_missed = [kind.value for kind in _ON_THE_RELAY if not report.history.relay_faults[kind]]
    assert not relay_missed, f"the relay never met {relay_missed}\n{table}"
    assert report.end.outbox and report.relay is not None and report.relay.given_up == 0, table
    assert sum(report.end.commits.values()) > 0, table
    # No reservation outlives its message: once the run drained, every pending mark was settled, whatever the
    # faults (a crash after the mark, a refused takeover, a failed release, a busy item).
    (tables,) = made
    periods = scan(local_servers.client("dynamodb"), tables["ChaosPeriodTable"])
    held = [item for item in periods if "pendingToken" in item]
    record_property(SHOWN, f"guarded items after the drain: {len(periods)}, still held: {len(held)}")
    assert periods and not held, f"holds left after the drain: {held[:3]}\n{table}"
    # The optimistic handler's writes land with its record, once: each tally's total is the sum of its distinct
    # entries applied, however often each was sent, cut off or taken over.
    applied = Checker(report.sent, report.end, report.history).applied_payloads(TALLY_EVENT)
    expected: Counter[str] = Counter()
    for entry in {payload["entryId"]: payload for payload in applied}.values():
        expected[entry["tallyId"]] += entry["amount"]
    dynamodb = local_servers.client("dynamodb")
    found = Counter({tally: tally_total(dynamodb, tables[TALLY_TABLE], tally) for tally in expected})
    assert expected and found == expected, f"tallies off their applied entries\n{table}"


def _built_without_the_application(run_dir: str) -> None:
    """The proof's run as far as it goes without servers, in an interpreter where the application cannot be
    imported: its handlers, its workload, and each runtime's consumer built from its plan as a cold start builds it."""
    handlers = harness.chaos_handlers(SHORT)
    harness.build_workload(SHORT, random.Random(SHORT.seed), "run", handlers)
    tables = {table_variable(name): name for name in (IDEMPOTENCY_TABLE, *declared_tables(handlers))}
    function = {**tables, "DEAD_LETTER_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/dlq"}
    for plan in harness._plans(SHORT, function, Path(run_dir), range(SHORT.pollers)):
        Environment(plan)
    importlib.import_module("consumer.relay")  # what the relay's runtime runs
    print(json.dumps(sorted(handler.event_type for handler in handlers)))


def test_the_proofs_run_never_reads_the_application(tmp_path: Path) -> None:
    # None in sys.modules: importing ``service`` or any module of it raises, as in a project whose examples are gone.
    script = (
        "import sys; sys.modules['service'] = None;"
        " from tests.core.reliability.test_chaos import _built_without_the_application as built;"
        f" built({str(tmp_path)!r})"
    )
    variables = {**os.environ, **DUMMY_CREDENTIALS_ENV, WEBHOOK_VARIABLE: "http://127.0.0.1:9"}
    answer = subprocess.run([sys.executable, "-c", script], env=variables, capture_output=True, text=True, check=False)
    assert answer.returncode == 0, answer.stderr[-3000:]
    built = json.loads(answer.stdout.strip().splitlines()[-1])
    handlers = (TallyHandler, CallOnTheSink, GuardedPeriod, ChainedNotice, LockedChainedNotice)
    assert built == sorted(handler.event_type for handler in handlers)


@pytest.mark.long(30)
def test_the_harness_catches_a_claim_without_its_condition(local_servers: LocalServers) -> None:
    # A claim that takes any record: each resend is applied and committed again.
    unconditional = "tests.core.chaos_handlers:unconditional_wire"
    config = replace(SHORT, seed=SHORT.seed + 1, messages=60, duplicate_ratio=0.5, consumer=unconditional)
    report = run(replace(config, forced={}), local_servers)
    table = render(report)
    print(table)
    assert _violations(report)["no key committed twice (commits DynamoDB accepted)"] > 0, table


@pytest.mark.long(25)
def test_the_harness_catches_a_store_without_fencing(local_servers: LocalServers) -> None:
    # Zombies only: each environment's first commit of the guarded handler, then drawn.
    rates = dict.fromkeys(FaultKind, 0.0) | {FaultKind.ZOMBIE: 0.5}
    unfenced = "tests.core.reliability.unfenced_consumer:unfenced_wire"
    config = replace(SHORT, messages=60, poison_ratio=0.0, duplicate_ratio=0.0, rates=rates)
    config = replace(config, forced={FaultKind.ZOMBIE: 1})
    report = run(replace(config, consumer=unfenced), local_servers)
    table = render(report)
    print(table)
    assert _violations(report)["no zombie commit or release over a newer owner"] > 0, table


@pytest.mark.long(25)
def test_the_harness_catches_a_lock_group_committed_after_its_slowest_handler(local_servers: LocalServers) -> None:
    # One slow handler per environment, beside other lock handlers, and no other fault. A quick neighbour's lease runs
    # out while its commit waits for the slow one: its redelivery is claimed and calls out again.
    rates = dict.fromkeys(FaultKind, 0.0)
    after_the_slowest = "tests.core.reliability.lock_group_consumer:committed_after_the_slowest"
    config = replace(SHORT, messages=60, poison_ratio=0.0, duplicate_ratio=0.0, rates=rates)
    config = replace(config, forced={FaultKind.SLOW_HANDLER: 1}, consumer=after_the_slowest)
    report = run(config, local_servers)
    table = render(report)
    print(table)
    assert _violations(report)[REPEATS] > 0, table
