"""vLLM V1's scheduler as an engine (`--engine vllm`). vLLM is imported only when an
engine is built; scripts/install_vllm.sh installs it."""
