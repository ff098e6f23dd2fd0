"""The fault-injection harness, short. With every fault on, the real consumer keeps every
invariant; pointed at consumers that get it wrong, the same harness reports violations
(a harness that cannot fail proves nothing)."""

from __future__ import annotations

from dataclasses import replace

from chaos.faults import DEFAULT_RATES, FaultKind
from chaos.harness import ChaosConfig, ChaosReport, run
from chaos.report import render
from testkit.servers import LocalServers

# Short, with the rates doubled so that a couple of hundred messages meet every kind of fault.
SHORT = ChaosConfig(
    seed=20240917,
    messages=160,
    pollers=3,
    # Twice the defaults; a crash after a claim four times: only receipts claim (payments apply in one
    # transaction), so at twice its 2% some runs of 160 messages never drew it.
    rates={kind: min(1.0, rate * 2) for kind, rate in DEFAULT_RATES.items()} | {FaultKind.CRASH_AFTER_CLAIM: 0.08},
    # Generous: under a loaded CI machine (two test workers) draining takes longer, and a timeout proves nothing.
    drain_timeout_s=180,
)


def _violations(report: ChaosReport) -> dict[str, int]:
    return {verdict.name: verdict.violations for verdict in report.verdicts}


def test_every_fault_on_and_every_invariant_holds(local_servers: LocalServers) -> None:
    report = run(SHORT, local_servers)
    table = render(report)
    print(table)
    assert report.violations == 0, table
    missing = [kind.value for kind in FaultKind if report.history.faults[kind] == 0]
    assert not missing, f"faults never injected, so never tested: {missing}\n{table}"
    assert report.history.crashed > 0 and report.history.redelivered_records > 0, table


def test_the_harness_catches_a_consumer_that_reads_then_writes(local_servers: LocalServers) -> None:
    # Half the short workload is enough: 7 to 12 violations in three measured runs (160 messages: 9).
    naive = "tests.reliability.naive_consumer:NaiveConsumer"
    report = run(replace(SHORT, seed=SHORT.seed + 1, messages=80, consumer=naive), local_servers)
    table = render(report)
    print(table)
    assert _violations(report)["no payment applied twice (balance = sum of distinct payments)"] > 0, table


def test_the_harness_catches_a_store_without_fencing(local_servers: LocalServers) -> None:
    # Receipts only, zombies only; a slow webhook keeps the new owner busy while the zombie resumes.
    rates = dict.fromkeys(FaultKind, 0.0) | {FaultKind.ZOMBIE: 0.5, FaultKind.WEBHOOK_SLOW: 1.0}
    unfenced = "tests.reliability.unfenced_consumer:unfenced_wire"
    config = replace(SHORT, messages=60, receipt_ratio=1.0, poison_ratio=0.0, duplicate_ratio=0.0, rates=rates)
    report = run(replace(config, webhook_timeout_ms=2_000, consumer=unfenced), local_servers)
    table = render(report)
    print(table)
    assert _violations(report)["no zombie commit or release over a newer owner"] > 0, table
