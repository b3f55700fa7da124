"""The `schedspec` command line: one module per command; what they print in printing/.

main.py is the group (`schedspec`, and `python -m schedspec`); it imports each
command's module only when that command runs, so `schedspec run` and
`schedspec check` start without torch, z3 or matplotlib. options.py holds the
click options several commands share, loading.py turns what the library
refuses into usage errors naming the flag. The commands parse, refuse and print;
what a run is and where it runs is the library's (properties/run_plan.py,
campaign/). Library modules never import this package: it sits on top of every
other folder, and tests/test_layering.py holds that.
"""

# The console script's target (pyproject: schedspec = "schedspec.cli:main"); main.py
# imports only click, so this costs nothing.
from schedspec.cli.main import main

__all__ = ["main"]
