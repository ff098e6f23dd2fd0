"""The run as a table: what was sent, what was injected, what came of it, and each invariant."""

from __future__ import annotations

from chaos.faults import FaultKind
from chaos.harness import ChaosReport

_WIDTH = 84


def _section(title: str) -> list[str]:
    return ["", title, "-" * _WIDTH]


def _row(label: str, value: object) -> str:
    return f"  {label:<{_WIDTH - 14}}{value!s:>10}"


def render(report: ChaosReport) -> str:
    config = report.config
    workload = report.workload
    history = report.history
    lines = [
        f"chaos run: seed {config.seed}, {config.pollers} pollers, {report.duration_s:.0f} s",
        *_section("sent"),
        _row("messages sent", report.sent),
        _row("distinct payments", workload.distinct_payments),
        _row("distinct receipt requests", workload.distinct_receipts),
        _row("duplicates (same key, new messageId)", workload.resends),
        _row("poison (incl. key reused with another payload)", workload.poison),
        _row(f"payments on {config.hot_accounts} hot accounts ({config.hot_share:.0%} share)", workload.hot_payments),
        *_section("faults injected"),
    ]
    lines += [_row(f"{kind.description} [{kind.value}]", report.faults.get(kind, 0)) for kind in FaultKind]
    lines += [
        _row("zombies that saw no takeover (not counted above)", report.zombies_without_takeover),
        _row(f"clock skew between runtimes (up to +/-{config.max_skew_ms} ms)", f"{history.containers} clocks"),
        *_section("outcomes"),
        _row("invocations", history.invocations),
        _row("  crashed (nothing deleted, batch comes back)", history.crashed),
        *(_row(f"  poller verdict {verdict}", count) for verdict, count in sorted(report.pollers.verdicts.items())),
        _row("runtimes started (cold starts, after crashes too)", history.containers),
        _row("records redelivered by SQS (receive count > 1)", history.redelivered_records),
        *(_row(f"record results: {outcome}", count) for outcome, count in sorted(history.outcomes.items())),
        *(_row(f"dead letters: {reason}", count) for reason, count in sorted(report.dead_letters.items())),
        _row("transaction conflicts seen", report.conflicts.seen),
        _row("  injected by the conflict fault", report.conflicts.injected),
        _row("  raised by the local stack's emulation (overlapping transactions)", report.conflicts.emulated),
        _row("  absorbed in process (retried within the record's time)", report.conflicts.absorbed),
        _row("  returned to SQS (outcome conflict)", report.conflicts.returned),
        _row("webhook calls", report.webhook_calls),
        _row("  receipts whose webhook was called more than once", report.receipts_called_again),
        *_section("invariants (violations; each must be 0)"),
    ]
    for verdict in report.verdicts:
        lines.append(_row(verdict.name, verdict.violations))
        lines += [f"      e.g. {example}" for example in verdict.examples]
    lines += ["", f"{'PASS' if report.violations == 0 else 'FAIL'}: {report.violations} violations"]
    return "\n".join(lines)
