"""Mutation testing: seeded bugs in the reference that the invariant suite must catch."""
