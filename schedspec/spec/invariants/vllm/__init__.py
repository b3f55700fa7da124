"""The vllm-v1 profile: vLLM V1's exact decisions, on top of safety."""
