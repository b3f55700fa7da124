"""gpu_impl: an independent torch implementation of the scheduler, and the execution layer.

It depends on `schedspec.spec` only, never on `schedspec.reference`: a
differential test between two implementations that share code proves little.
"""
