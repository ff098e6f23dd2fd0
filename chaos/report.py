"""The run as a table: what was sent, what was injected, what came of it, and each invariant."""

from __future__ import annotations

from collections import Counter

from chaos.faults import FaultKind
from chaos.harness import ChaosReport

_WIDTH = 84


def _section(title: str) -> list[str]:
    return ["", title, "-" * _WIDTH]


def _row(label: str, value: object) -> str:
    return f"  {label:<{_WIDTH - 14}}{value!s:>10}"


def _relay_rows(report: ChaosReport) -> list[tuple[str, int]]:
    stats = report.relay
    if stats is None:
        return []
    verdicts = [(f"verdict {verdict}", count) for verdict, count in sorted(stats.verdicts.items())]
    faults = [(f"fault {kind.value}", count) for kind, count in sorted(report.history.relay_faults.items())]
    return [("invocations", stats.invocations), *verdicts, ("records given up", stats.given_up), *faults]


def render(report: ChaosReport) -> str:
    config, history, end = report.config, report.history, report.end
    business = [message for message in report.sent.values() if message.kind == "drawn"]
    distinct = {message.key: message for message in business}  # a resend reuses its original's key
    by_type = Counter(message.event_type for message in distinct.values())
    hot = len(distinct) - len({message.body.replace(message.key or "", "") for message in distinct.values()})
    injected_conflicts = history.faults[FaultKind.TRANSACTION_CONFLICT]
    webhook_calls_per_key = Counter(call.idempotency_key for call in end.webhook_calls)
    dead_letters = Counter(letter.error_type or "redrive (no reason)" for letter in end.dead_letters)
    lines = [
        f"chaos run: seed {config.seed}, {config.pollers} pollers, {report.duration_s:.0f} s",
        *_section("sent"),
        _row("messages sent", len(report.sent)),
        *(_row(f"distinct {event_type} (drawn from its model)", count) for event_type, count in by_type.items()),
        _row("duplicates (same key, new messageId)", len(business) - len(distinct)),
        _row("poison and keys reused with another payload", len(report.sent) - len(business)),
        _row(f"on another's payload under a key of its own (hot items, {config.hot_share:.0%})", hot),
        *_section("faults injected"),
    ]
    lines += [_row(f"{kind.description} [{kind.value}]", history.faults[kind]) for kind in FaultKind]
    lines += [
        _row("zombies that saw no takeover (not counted above)", history.zombies_without_takeover),
        _row("crashes while other lock handlers ran (inside a lock wave)", history.crashes_in_a_wave),
        _row(f"clock skew between runtimes (up to +/-{config.max_skew_ms} ms)", f"{history.cold_starts} clocks"),
        *_section("outcomes"),
        _row("invocations", history.pollers.invocations),
        _row("  crashed (nothing deleted, batch comes back)", history.crashed),
        *(_row(f"  poller verdict {verdict}", count) for verdict, count in sorted(history.pollers.verdicts.items())),
        _row("runtimes started (cold starts, after crashes too)", history.cold_starts),
        _row("records redelivered by SQS (receive count > 1)", history.redelivered_records),
        *(_row(f"record results: {outcome}", count) for outcome, count in sorted(history.outcomes.items())),
        *(_row(f"dead letters: {reason}", count) for reason, count in sorted(dead_letters.items())),
        _row("transaction conflicts seen", injected_conflicts + report.emulated_conflicts),
        _row("  injected by the conflict fault", injected_conflicts),
        _row("  raised by the local stack's emulation (overlapping transactions)", report.emulated_conflicts),
        _row("  absorbed in process (retried within the record's time)", history.conflicts_absorbed),
        _row("  returned to SQS (outcome conflict)", history.outcomes["conflict"]),
        _row("webhook calls", len(end.webhook_calls)),
        _row("  keys whose webhook was called more than once", sum(n > 1 for n in webhook_calls_per_key.values())),
        _row("commits DynamoDB accepted (seen at the conflict proxy)", sum(end.commits.values())),
        _row("messages emitted (outbox items)", len(end.outbox)),
        *(_row(f"  relay {name}", value) for name, value in _relay_rows(report)),
        *_section("invariants (violations; each must be 0)"),
    ]
    for verdict in report.verdicts:
        lines.append(_row(verdict.name, verdict.violations))
        lines += [f"      e.g. {example}" for example in verdict.examples]
    lines += ["", f"{'PASS' if report.violations == 0 else 'FAIL'}: {report.violations} violations"]
    return "\n".join(lines)
