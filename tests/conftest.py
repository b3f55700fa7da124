"""Hypothesis profiles: a quick one by default (CI), a long one behind SCHEDSPEC_LONG=1."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "long", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("long" if os.environ.get("SCHEDSPEC_LONG") == "1" else "ci")
