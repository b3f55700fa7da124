"""The safety profile: what every correct engine keeps, whatever its policy family.

One module per call kind or topic. The catalogue registers each predicate when its
module is imported (spec/invariants/__init__.py fixes the order).
"""
