"""SGLang's scheduler as an engine (`--engine sglang`). SGLang is imported only when an
engine is built; `schedspec install sglang VENV` installs it, in a venv of its own."""
