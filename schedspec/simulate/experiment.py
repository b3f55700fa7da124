"""The chunked-prefill trade-off, read off a run of the long-prompt workload.

Decodes are running when one long prompt arrives. Run whole, the prompt
makes one long step, and every decode waits through it: the decodes' worst
time per output token (their longest gap between two tokens) jumps. Cut
into chunks, each step stays short, but the prompt needs several steps, each
also carrying the decodes and paying the weight-read floor again: the long
request's TTFT goes up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schedspec.simulate.metrics import RequestMetrics
from schedspec.simulate.workloads import (
    DECODE_OUTPUT_LEN,
    LONG_PROMPT_ARRIVAL,
    LONG_PROMPT_ID,
    NUM_DECODES,
)


@dataclass(frozen=True)
class TradeOff:
    name: str
    long_ttft_s: float  # the long prompt's time to first token
    decodes_worst_gap_s: float  # the decodes' worst TPOT: their longest gap between tokens
    decodes_worst_mean_tpot_s: float  # the largest of their mean TPOTs


def trade_off(name: str, metrics: Sequence[RequestMetrics]) -> TradeOff:
    by_id = {m.request_id: m for m in metrics}
    if LONG_PROMPT_ID not in by_id:
        raise ValueError(f"{name}: no request {LONG_PROMPT_ID!r}; run the long-prompt workload")
    decodes = [m for m in metrics if m.request_id != LONG_PROMPT_ID]
    return TradeOff(
        name=name,
        long_ttft_s=by_id[LONG_PROMPT_ID].ttft,
        decodes_worst_gap_s=max(m.worst_gap or 0.0 for m in decodes),
        decodes_worst_mean_tpot_s=max(m.tpot or 0.0 for m in decodes),
    )


def format_trade_offs(rows: Sequence[TradeOff], long_prompt_len: int) -> list[str]:
    lines = [
        f"Chunked-prefill trade-off: a {long_prompt_len}-token prompt arrives at "
        f"{LONG_PROMPT_ARRIVAL} s among {NUM_DECODES} requests decoding {DECODE_OUTPUT_LEN} tokens",
    ]
    width = max(len(r.name) for r in rows)
    for r in rows:
        lines.append(
            f"  {r.name:<{width}}  long prompt TTFT {r.long_ttft_s * 1000:6.1f} ms   "
            f"decodes' worst TPOT (longest gap) {r.decodes_worst_gap_s * 1000:6.1f} ms   "
            f"(worst mean TPOT {r.decodes_worst_mean_tpot_s * 1000:.1f} ms)"
        )
    if len(rows) == 2:
        whole, chunked = rows
        lines.append(
            f"  {chunked.name} vs {whole.name}: long prompt TTFT "
            f"x{chunked.long_ttft_s / whole.long_ttft_s:.2f}, decodes' worst TPOT "
            f"x{chunked.decodes_worst_gap_s / whole.decodes_worst_gap_s:.2f}"
        )
    return lines
