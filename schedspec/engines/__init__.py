"""Engines as the harness sees them: the adapter protocol every engine speaks, the one
guarded door every call goes through (time limit, attribution, exits trapped) and its
errors, the registry of engines by name and the optional dependencies they need, the
profiles an engine claims, and the engine loop the harness plays around it (the fake
model, the engine core's order of calls, the events of a trace).

Imports nothing of schedspec but spec/ (tests/test_layering.py): adapters, traces,
properties and campaigns build on it.
"""
