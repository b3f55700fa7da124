"""Commands that prepare an environment for schedspec rather than check an engine:
`schedspec install` (install.py). A folder of their own keeps cli/ uncrowded."""
