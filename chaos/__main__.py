"""``python -m chaos``: one fault-injection run on a local stack of its own; exit 1 on any violation.

python -m chaos --seed 7 --messages 5000 --pollers 4
python -m chaos --rate "zombie past its lease=0.1" --rate throttled=0
python -m chaos --no-faults
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from dataclasses import fields

from chaos.faults import DEFAULT_RATES, FaultKind
from chaos.function import ConsumerFactory
from chaos.harness import ChaosConfig, run
from chaos.report import render
from consumer.app import wire
from testkit.servers import LocalServers

_DEFAULTS = ChaosConfig()


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


def _consumer_factory(text: str) -> ConsumerFactory:
    module_name, separator, attribute = text.partition(":")
    if not separator:
        raise argparse.ArgumentTypeError(f"expected module:callable, got {text!r}")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise argparse.ArgumentTypeError(f"cannot load {text!r}: {error}") from None


def parse(argv: Sequence[str]) -> tuple[ChaosConfig, ConsumerFactory]:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.split("\n", 1)[0])
    numbers = {field.name: field for field in fields(ChaosConfig) if field.type in ("int", "float")}
    for name in numbers:
        default = getattr(_DEFAULTS, name)
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=type(default), default=default, help=f"(default {default})"
        )
    parser.add_argument("--rate", type=_rate, action="append", default=[], help="KIND=RATE, repeatable")
    parser.add_argument("--fault-scale", type=float, default=1.0, help="multiply every default rate (default 1)")
    parser.add_argument("--no-faults", action="store_true", help="every rate 0: the control run")
    parser.add_argument(
        "--consumer",
        type=_consumer_factory,
        default=wire,
        help="module:callable(settings, session, *, clock) building the consumer (default consumer.app:wire)",
    )
    arguments = parser.parse_args(argv)
    scale = 0.0 if arguments.no_faults else arguments.fault_scale
    rates = {kind: min(1.0, rate * scale) for kind, rate in DEFAULT_RATES.items()}
    rates.update(dict(arguments.rate))
    config = ChaosConfig(**{name: getattr(arguments, name) for name in numbers}, rates=rates)
    return config, arguments.consumer


def main(argv: Sequence[str] | None = None) -> int:
    config, consumer_factory = parse(sys.argv[1:] if argv is None else argv)
    # A delete after a redelivery fails by design (stale receipt handle); the report counts what matters.
    logging.getLogger("local.poller").setLevel(logging.ERROR)
    with LocalServers() as servers:
        report = run(config, servers, consumer_factory)
    print(render(report))
    return 0 if report.violations == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
