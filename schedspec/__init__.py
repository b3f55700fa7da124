"""schedspec: an executable specification of LLM-serving schedulers."""

__version__ = "0.1.0"
