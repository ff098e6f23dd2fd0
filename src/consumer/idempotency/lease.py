"""How long a claim holds its key."""

from __future__ import annotations


def lease_duration(remaining_ms: int, *, margin_ms: int, min_ms: int, max_ms: int) -> int:
    """The invocation's remaining time less a margin, capped, and never below ``min_ms``.

    A remaining time of 0 (or a context that reports nothing) must not mean "no
    lease": a zero lease would let another worker take the key over at once while
    this one is still running.
    """
    if min_ms <= 0 or max_ms < min_ms:
        raise ValueError(f"need 0 < min_ms <= max_ms, got min_ms={min_ms}, max_ms={max_ms}")
    return max(min_ms, min(max_ms, remaining_ms - margin_ms))
