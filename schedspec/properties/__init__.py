"""Harness pieces that drive any engine: the fake model, and later strategies,
state machines, adapters and the differential runner."""
