"""`python -m schedspec`: the command line without its installed script."""

from schedspec.cli.main import main

main()
