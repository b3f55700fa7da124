"""The Z3 formal layer: a counts model of one scheduling step, with proofs.

encoding (terms), rules (one function per scheduler rule), step (the step
unrolled over N slots), properties (the invariants by catalogue id),
parametric (per-slot lemmas and induction: every N), monolithic (one query
per N: cross-checks), progress (NO-EMPTY-STEP), variants (broken steps),
bmc (reachable counterexamples), prover (what `schedspec prove` runs).
Depends on z3 and schedspec.spec only. See docs/FORMAL.md.
"""
