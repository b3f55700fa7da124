"""One workload, two policy families: where vLLM and SGLang decide differently
(docs/ENGINES.md and docs/SPEC.md, "Two families side by side").

a (6-token prompt, 3 tokens) arrives first; b (8-token prompt, 3 tokens) arrives
before step 2. vLLM V1 serves running requests first and fills the rest of the
budget with admissions, so step 2 decodes a and prefills b together. SGLang runs
prefill first: step 2 prefills b alone while a waits, and a finishes a step later.
"""

from __future__ import annotations

from dataclasses import replace

from schedspec.adapters.reference import reference_engine
from schedspec.spec import ModelRunnerOutput, Request, SchedulerConfig
from tests.sglang_helpers import prompt

VLLM = SchedulerConfig(
    block_size=1, num_blocks=24, max_num_batched_tokens=16, max_num_seqs=4, max_model_len=24
)
SGLANG = replace(VLLM, family="sglang")
ARRIVALS = {0: [("a", prompt(1, 6))], 2: [("b", prompt(2, 8))]}


def scheduled_per_step(config: SchedulerConfig, steps: int) -> list[dict[str, int]]:
    """The reference in the config's family, stepped synchronously through the spec's
    calls only; each request samples token 5 whenever its step samples."""
    engine = reference_engine(config)
    per_step = []
    for step in range(steps):
        for rid, tokens in ARRIVALS.get(step, []):
            engine.add_request(Request(rid, tokens, 3))
        output = engine.schedule()
        state = engine.snapshot()
        sampled = {
            rid: [5]
            for rid in output.num_scheduled_tokens
            if not state.requests[rid].is_prefill_chunk
        }
        engine.update_from_output(output, ModelRunnerOutput(sampled))
        per_step.append(dict(output.num_scheduled_tokens))
    return per_step


def test_vllm_decodes_a_beside_b_prefill() -> None:
    assert scheduled_per_step(VLLM, 5) == [
        {"a": 6},
        {"a": 1},
        {"a": 1, "b": 8},
        {"b": 1},
        {"b": 1},
    ]


def test_sglang_prefills_b_first_and_a_waits() -> None:
    assert scheduled_per_step(SGLANG, 5) == [
        {"a": 6},
        {"a": 1},
        {"b": 8},
        {"a": 1, "b": 1},
        {"b": 1},
    ]
