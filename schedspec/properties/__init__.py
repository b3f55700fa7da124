"""The property-based harness: an engine under every invariant of a profile (the checked
engine, with the harness's KV oracle and named corners), the conformance state machine and
what it draws (strategies/), the suite runner and the minimizer, the lockstep runner
that diffs two engines, a trace replayed with every output kept, failure reports, the
run plan every entry point resolves, the pytest plugin, and the install probe."""
