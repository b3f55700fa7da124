"""Field checks shared by the config dataclasses: each raises ConfigError naming the field."""

from __future__ import annotations

from schedspec.spec.errors import ConfigError, shown


def require_int(
    name: str, value: object, minimum: int, maximum: int | None = None, why: str = ""
) -> None:
    # bool is an int subclass; True as a block size is a bug, not a 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(name, f"must be an int, got {shown(value)}")
    if value < minimum:
        raise ConfigError(name, f"must be >= {minimum}, got {shown(value)}")
    if maximum is not None and value > maximum:
        raise ConfigError(name, f"must be <= {maximum} ({why}), got {shown(value)}")
