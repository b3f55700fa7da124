"""SGLang's scheduler as an engine (`--engine sglang`). SGLang is imported only when an
engine is built; scripts/install_sglang.sh installs it, in a venv of its own."""
