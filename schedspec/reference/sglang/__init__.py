"""The SGLang family of the reference: SGLangScheduler, its admission (PrefillAdder's
rules), batches, requests, and the token-slot pool with a radix tree."""
