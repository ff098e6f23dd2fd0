"""The conflict emulation's settings: defaults, the off switch, and refusals that name the variable."""

from __future__ import annotations

import pytest

from testkit.conflict_emulation import (
    CONFLICTS_ENV,
    DEFAULT_HOLD_MS,
    HOLD_ENV,
    LATENCY_ENV,
    ConflictEmulation,
    EmulationSettingError,
)


def test_on_by_default() -> None:
    assert ConflictEmulation.from_env({}) == ConflictEmulation(conflicts=True, hold_ms=DEFAULT_HOLD_MS, latency_ms=0.0)


def test_the_environment_tunes_it() -> None:
    env = {CONFLICTS_ENV: "OFF", HOLD_ENV: "12.5", LATENCY_ENV: "10"}
    assert ConflictEmulation.from_env(env) == ConflictEmulation(conflicts=False, hold_ms=12.5, latency_ms=10.0)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({CONFLICTS_ENV: "maybe"}, CONFLICTS_ENV),
        ({HOLD_ENV: "five"}, HOLD_ENV),
        ({HOLD_ENV: "-1"}, HOLD_ENV),
        ({LATENCY_ENV: "nan"}, LATENCY_ENV),
    ],
)
def test_a_bad_value_names_its_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(EmulationSettingError, match=named):
        ConflictEmulation.from_env(env)


def test_negative_arguments_are_refused() -> None:
    with pytest.raises(EmulationSettingError, match="latency_ms"):
        ConflictEmulation(latency_ms=-1.0)


def test_it_describes_itself() -> None:
    assert ConflictEmulation().describe() == "conflicts ON, prepare hold 5 ms, 0 ms added per call"
    assert ConflictEmulation(conflicts=False, latency_ms=10).describe() == "conflicts OFF, 10 ms added per call"
