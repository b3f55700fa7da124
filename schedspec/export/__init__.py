"""A trace as a standalone pytest file for an engine's own test suite (`schedspec
export-test`): the engine's scheduler driven as its own tests drive it, no schedspec
import, the invariants written as plain asserts on the engine's objects."""
