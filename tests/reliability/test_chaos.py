"""The fault-injection harness, short. With every fault on, the real consumer keeps every
invariant; pointed at consumers that get it wrong, the same harness reports violations
(a harness that cannot fail proves nothing)."""

from __future__ import annotations

from dataclasses import replace

from chaos.faults import FaultKind
from chaos.harness import ChaosConfig, ChaosReport, run
from chaos.report import render
from testkit.servers import LocalServers

# Short, at the default rates, and every kind of fault forced once in each execution environment (at its first
# opportunity, whatever the draws): whether the run meets every kind never depends on luck.
SHORT = ChaosConfig(
    seed=20240917,
    messages=160,
    pollers=3,
    forced=dict.fromkeys(FaultKind, 1),
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
    # A forced crash ends an invocation under way: its batch comes back.
    assert report.history.crashed > 0 and report.history.redelivered_records > 0, table


def test_the_harness_catches_a_consumer_that_reads_then_writes(local_servers: LocalServers) -> None:
    # Payments only, each environment's first write answered as lost: the naive consumer's first balance update is
    # applied, its answer lost, and botocore sends it again: a payment credited twice, whatever else is drawn.
    naive = "tests.reliability.naive_consumer:NaiveConsumer"
    config = replace(SHORT, seed=SHORT.seed + 1, messages=80, receipt_ratio=0.0, consumer=naive)
    report = run(replace(config, forced={FaultKind.LOST_ANSWER: 1}), local_servers)
    table = render(report)
    print(table)
    assert _violations(report)["no payment applied twice (balance = sum of distinct payments)"] > 0, table


def test_the_harness_catches_a_store_without_fencing(local_servers: LocalServers) -> None:
    # Receipts only, zombies only (each environment's first commit, then drawn); a slow webhook keeps the new owner
    # busy while the zombie resumes.
    rates = dict.fromkeys(FaultKind, 0.0) | {FaultKind.ZOMBIE: 0.5, FaultKind.WEBHOOK_SLOW: 1.0}
    unfenced = "tests.reliability.unfenced_consumer:unfenced_wire"
    config = replace(SHORT, messages=60, receipt_ratio=1.0, poison_ratio=0.0, duplicate_ratio=0.0, rates=rates)
    config = replace(config, forced={FaultKind.ZOMBIE: 1})
    report = run(replace(config, webhook_timeout_ms=2_000, consumer=unfenced), local_servers)
    table = render(report)
    print(table)
    assert _violations(report)["no zombie commit or release over a newer owner"] > 0, table
