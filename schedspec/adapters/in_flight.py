"""A step landing on a real engine, checked before the engine sees it: what the vLLM and
SGLang adapters both refuse in update_from_output.

Both engines land steps in the order they scheduled them (vLLM's engine core, SGLang's
overlap loop), and their counters of what is in flight count on that; the harness must
hand back the oldest step in flight, and sample tokens only for the requests it
scheduled. Either mistake is the harness's, an OutputError naming the field, raised
before the engine's state changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from schedspec.spec import OutputError, SchedulerOutput


def check_landing(
    oldest: SchedulerOutput | None,
    scheduler_output: SchedulerOutput,
    sampled: Mapping[str, Sequence[int]],
) -> None:
    """`scheduler_output` must be `oldest` (the oldest schedule() output in flight, None
    when none is) or equal to it, and `sampled` may name only requests it scheduled."""
    if oldest is None or (oldest is not scheduler_output and oldest != scheduler_output):
        raise OutputError("scheduler_output", "not the oldest schedule() output in flight")
    strangers = sorted(set(sampled) - set(scheduler_output.num_scheduled_tokens))
    if strangers:
        raise OutputError("sampled_token_ids", f"requests not scheduled: {strangers}")
