"""The `schedspec` command line: one module per command and its report.

main.py is the group (`schedspec`, and `python -m schedspec`); it imports each
command's module only when that command runs, so `schedspec run` and
`schedspec check` start without torch, z3 or matplotlib. options.py holds the
click options several commands share, loading.py turns what the library
refuses into usage errors. Library modules never import this package: the
commands sit on top of `spec`, `reference`, `gpu_impl`, `properties` and
`simulate`, and tests/test_layering.py holds that.
"""

# The console script's target (pyproject: schedspec = "schedspec.cli:main"); main.py
# imports only click, so this costs nothing.
from schedspec.cli.main import main

__all__ = ["main"]
