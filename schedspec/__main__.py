"""`python -m schedspec`: the command line without its installed script."""

from schedspec.cli import main

main()
