"""``python -m chaos``: one fault-injection run on a local stack of its own; exit 1 on any violation."""

from __future__ import annotations

import argparse
import logging
import pkgutil
import random
import sys
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from chaos.faults import DEFAULT_RATES, FaultKind
from chaos.harness import ChaosConfig, run
from chaos.report import render
from testkit.servers import LocalServers

_DEFAULTS = ChaosConfig()
# The core's chain of two consumers through the outbox: notices (optimistic and lock mode) whose tally messages the
# relay sends back to this consumer, and the tally handler that applies them (its table's keys the core tests' own).
_CHAIN = (
    "tests.core.handlers:TallyHandler",
    "tests.core.chaos_handlers:ChainedNotice",
    "tests.core.chaos_handlers:LockedChainedNotice",
)
_CHAIN_TABLES = "tests.core.handlers:TABLE_PROPERTIES"


def _rate(text: str) -> tuple[FaultKind, float]:
    name, separator, value = text.rpartition("=")
    if not separator:
        raise argparse.ArgumentTypeError(f"expected KIND=RATE, got {text!r}")
    try:
        kind = FaultKind(name.strip())
    except ValueError:
        known = ", ".join(repr(kind.value) for kind in FaultKind)
        raise argparse.ArgumentTypeError(f"unknown fault {name!r}; known: {known}") from None
    rate = float(value)
    if not 0 <= rate <= 1:
        raise argparse.ArgumentTypeError(f"a rate is a probability in [0, 1], got {rate}")
    return kind, rate


def _consumer(text: str) -> str:
    """``module:callable``, loaded here so that a wrong one fails now rather than in every runtime."""
    if ":" not in text:
        raise argparse.ArgumentTypeError(f"expected module:callable, got {text!r}")
    try:
        pkgutil.resolve_name(text)
    except (ImportError, AttributeError) as error:
        raise argparse.ArgumentTypeError(f"cannot load {text!r}: {error}") from None
    return text


def parse(argv: Sequence[str]) -> ChaosConfig:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.split("\n", 1)[0])
    options = [field.name for field in fields(ChaosConfig) if field.type in ("int", "float", "bool")]
    for name in options:
        default = getattr(_DEFAULTS, name)
        if name == "seed":  # exploration: each run draws from a new seed, printed first, which --seed replays
            default = random.SystemRandom().randrange(1 << 32)
        shown = "a new one each run, printed" if name == "seed" else default
        kind: dict[str, Any] = (
            {"action": argparse.BooleanOptionalAction} if isinstance(default, bool) else {"type": type(default)}
        )
        parser.add_argument(f"--{name.replace('_', '-')}", **kind, default=default, help=f"default {shown}")
    parser.add_argument("--rate", type=_rate, action="append", default=[], help="KIND=RATE, repeatable")
    parser.add_argument("--fault-scale", type=float, default=1.0, help="multiply every default rate (default 1)")
    parser.add_argument("--no-faults", action="store_true", help="every rate 0: the control run")
    parser.add_argument(
        "--consumer",
        type=_consumer,
        default=_DEFAULTS.consumer,
        help=f"module:callable(settings, session, *, clock) building the consumer (default {_DEFAULTS.consumer})",
    )
    parser.add_argument("--handler", type=_consumer, action="append", default=[], help="module:Class, repeatable")
    parser.add_argument("--chain", action="store_true", help="add the core's chain through the outbox and its relay")
    arguments = parser.parse_args(argv)
    if not arguments.registered and not arguments.handler and not arguments.chain:
        parser.error("--no-registered runs the --handler classes (or --chain) alone: give one at least")
    scale = 0.0 if arguments.no_faults else arguments.fault_scale
    rates = {kind: min(1.0, rate * scale) for kind, rate in DEFAULT_RATES.items()}
    rates.update(dict(arguments.rate))
    return ChaosConfig(
        **{name: getattr(arguments, name) for name in options},
        rates=rates,
        consumer=arguments.consumer,
        handlers=(*(_CHAIN if arguments.chain else ()), *arguments.handler),
        table_properties=pkgutil.resolve_name(_CHAIN_TABLES) if arguments.chain else {},
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = parse(sys.argv[1:] if argv is None else argv)
    print(f"chaos run: seed {config.seed} (the same arguments and --seed {config.seed} replay it)", flush=True)
    # A delete after a redelivery fails by design (stale receipt handle); the report counts what matters.
    logging.getLogger("local.poller").setLevel(logging.ERROR)
    with LocalServers() as servers:
        report = run(config, servers)
    print(render(report))
    return 0 if report.violations == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
