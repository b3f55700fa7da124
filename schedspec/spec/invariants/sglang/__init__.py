"""The sglang profile: SGLang's exact decisions, on top of safety."""
