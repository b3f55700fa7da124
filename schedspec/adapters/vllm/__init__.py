"""vLLM V1's scheduler as an engine (`--engine vllm`). vLLM is imported only when an
engine is built; `schedspec install vllm` installs it."""
