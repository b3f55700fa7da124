"""An engine in another Python interpreter (another venv), driven over a pipe.

The harness in this process speaks the adapter protocol to a RemoteEngine
(engine.py), which forwards every call to a child process that runs the real
adapter (`python -m schedspec.engines.remote.server ENGINE`, server.py): two releases
of one engine, or engines whose pins clash, in one run. It is an engine boundary, not
a campaign backend: the child is an EngineFactory's, and the in-process failure
contract holds across it (errors.py): what the engine raises comes back as raised,
an engine that ends its process is EngineExitError, a hung child is the step
watchdog's, and the child is always reaped (process.py). wire.py frames the messages
and checks on connect that both ends run the same schedspec.
"""
