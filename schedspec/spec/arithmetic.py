"""The one integer helper the spec's rules share."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many blocks of b tokens hold a tokens (b > 0)."""
    return -(-a // b)
