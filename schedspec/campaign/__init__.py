"""Runs on many workers: the suite's examples and swarm mode's configs in chunks, on
forked local processes or a Ray cluster, for a count or until a deadline, with a shared
example database; the backend chosen and the chunks planned here, so the command line
only parses and prints.
"""
