"""Traces: a run written down (the config, the harness model's parameters, the events in
order) as a file that replays on any engine, a Z3 counterexample as such a run, and what
two engines may not disagree on in lockstep.

Builds on engines/ only; the checked replay, the lockstep runner and the failure
reports that use traces live in properties/.
"""
