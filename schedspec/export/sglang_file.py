"""A trace as a pytest file for SGLang: its own Scheduler, built by its own __init__ on
CPU and stepped the way its plain event loop steps it, as schedspec's SGLang adapter
does (adapters/sglang/: the tiny model registered through ModelRegistry, a socket for
the tokenizer manager, the batch result's tokens written before SGLang processes it).

The config's translation is the adapter's (adapters/sglang/config.py's ServerArgs),
written out as constants. What the file cannot run is refused naming the config field
(lowering.config_refusal): the overlap loop (async scheduling), and whatever the adapter
refuses.
"""

from __future__ import annotations

from collections.abc import Mapping

from schedspec.adapters.sglang.config import refusal, server_arg_values
from schedspec.adapters.sglang.runtime import TINY_MODEL
from schedspec.export.lowering import Lowering, config_refusal
from schedspec.export.source import assignment
from schedspec.export.test_file import Provenance, render
from schedspec.traces.trace import Trace

SGLANG = Lowering(
    engine="SGLang",
    family="sglang",
    loop="steps SGLang's plain event loop, not the overlap loop",
    takes_drafts=False,
)
ABOUT = (
    "It builds SGLang's Scheduler on CPU by its own __init__ (a tiny model registered "
    "through ModelRegistry that writes no KV; a ZeroMQ socket standing in for the "
    "tokenizer manager), hands it tokenized requests, and steps it as its plain event loop "
    "does: get_next_batch_to_run(), run_batch(), process_batch_result() with the model's "
    "tokens. The model is a deterministic function of (seed, request id, position). After "
    "every step it asserts schedspec's invariants (SEQS, PROGRESS; DRAIN after a drain) on "
    "the scheduler's own objects: it fails where the bug is and passes on a fixed SGLang."
)


def sglang_test_file(
    trace: Trace, provenance: Provenance, engine_args: Mapping[str, object]
) -> str:
    """The pytest file; engine_args: ServerArgs set as given, over the config's."""
    refused = config_refusal(trace.config, SGLANG, refusal(trace.config))
    if refused is not None:
        raise refused
    args = {**server_arg_values(trace.config), **engine_args}
    constants = [
        "# SGLang's ServerArgs for the trace's config (but model_path: the test's folder).",
        *assignment("SERVER_ARGS", args),
        "# The model: tokens are a pure function of these.",
        *assignment("SEED", trace.model.seed),
        *assignment("VOCAB_SIZE", trace.model.vocab_size),
        *assignment("TINY_MODEL", TINY_MODEL),
    ]
    return render("sglang", constants, [ABOUT], provenance, trace.config, trace.events, SGLANG)
