"""What the commands show and write: the check, diff, prove and run reports, the progress
bars, and the JUnit/JSON reports for CI. Printing only: every decision is the library's.
"""
