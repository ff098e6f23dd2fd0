"""The conflict proxy as a child server of the local stack, on by default: ``LOCAL_DYNAMODB_CONFLICTS=off`` forwards
everything, as DynamoDB Local alone behaves (to measure what the emulation changes, never to prove anything);
``LOCAL_DYNAMODB_TRANSACTION_HOLD_MS`` sets a transaction's prepare time (default 5) and ``LOCAL_DYNAMODB_LATENCY_MS``
the round-trip latency added to every call (default 0)."""

from __future__ import annotations

import contextlib
import json
import sys
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

from testkit.processes import LoopbackServer

CONFLICTS_ENV = "LOCAL_DYNAMODB_CONFLICTS"
HOLD_ENV = "LOCAL_DYNAMODB_TRANSACTION_HOLD_MS"
LATENCY_ENV = "LOCAL_DYNAMODB_LATENCY_MS"
DEFAULT_HOLD_MS = 5.0
# DynamoDB has no such path, so no client's request is ever taken for it.
STATS_PATH = "/conflict-proxy/stats"
COMMITS_PATH = "/conflict-proxy/commits"
_SWITCH = {"on": True, "1": True, "true": True, "off": False, "0": False, "false": False}


class EmulationSettingError(ValueError):
    """A conflict-emulation setting that cannot be used; the message names the variable."""


@dataclass(frozen=True)
class ConflictEmulation:
    conflicts: bool = True
    hold_ms: float = DEFAULT_HOLD_MS
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        for name, value in (("hold_ms", self.hold_ms), ("latency_ms", self.latency_ms)):
            if not value >= 0:  # NaN is refused too
                raise EmulationSettingError(f"the {name.removesuffix('_ms')} must be >= 0 ms, got {name}={value!r}")

    def describe(self) -> str:
        conflicts = f"conflicts ON, prepare hold {self.hold_ms:g} ms" if self.conflicts else "conflicts OFF"
        return f"{conflicts}, {self.latency_ms:g} ms added per call"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        switch = env.get(CONFLICTS_ENV, "on").strip().lower()
        if switch not in _SWITCH:
            raise EmulationSettingError(f"{CONFLICTS_ENV} must be on or off, got {env[CONFLICTS_ENV]!r}")
        return cls(_SWITCH[switch], _milliseconds(env, HOLD_ENV, DEFAULT_HOLD_MS), _milliseconds(env, LATENCY_ENV, 0.0))


def _milliseconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    with contextlib.suppress(ValueError):
        if float(raw) >= 0:  # NaN is not
            return float(raw)
    raise EmulationSettingError(f"{name} must be a number of milliseconds >= 0, got {raw!r}")


class ConflictProxy(LoopbackServer):
    name = "dynamodb-conflict-proxy"

    def __init__(self, upstream: str, emulation: ConflictEmulation) -> None:
        super().__init__()
        self.upstream = upstream
        self.emulation = emulation

    def _command(self, port: int) -> list[str]:
        settings = ["--hold-ms", str(self.emulation.hold_ms), "--latency-ms", str(self.emulation.latency_ms)]
        switch = [] if self.emulation.conflicts else ["--no-conflicts"]
        proxy = [sys.executable, "-m", "testkit.conflict_proxy", "--upstream", self.upstream, "--port", str(port)]
        return [*proxy, *settings, *switch]

    def stats(self, path: str = STATS_PATH) -> dict[str, int]:
        """What the proxy has seen: ``transactions``, ``transactions_cancelled``, ``writes_refused``; or at
        ``COMMITS_PATH``, the commits DynamoDB accepted per idempotency record (``table/id``)."""
        with urllib.request.urlopen(f"{self.endpoint_url}{path}", timeout=10) as answer:
            return json.load(answer)
