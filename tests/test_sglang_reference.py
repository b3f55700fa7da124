"""The reference's SGLang family, step for step against SGLang 0.5.23 as observed on CPU.

Each table is what SGLang's real Scheduler did on the same workload (recorded through
the peer-probe recipe, tests/sglang_helpers.py): per loop iteration the batch kind and
tokens per request, the waiting queue, the chunked request, the pool's (free, evictable,
protected) token slots, new_token_ratio and the admission latch. The reference must
reproduce every row; the named tests below then spell out the rule each example shows.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from schedspec.adapters.reference import reference_engine
from schedspec.engines.events import Step
from schedspec.properties.checked_engine import CheckedEngine
from schedspec.reference import SGLangScheduler
from schedspec.spec import RequestStatus, SchedulerConfig
from schedspec.traces.trace import Trace
from tests.sglang_helpers import Driver, Event, ObservedRow, Row, as_row, prompt

FINDINGS = Path(__file__).resolve().parent.parent / "docs" / "findings"

BASE = SchedulerConfig(
    family="sglang",
    block_size=1,
    num_blocks=64,
    max_num_batched_tokens=8,
    max_num_seqs=4,
    max_model_len=64,
    enable_prefix_caching=True,
)


SHARED = prompt(7, 12)

ADMISSION_CONFIG = replace(
    BASE, num_blocks=68, max_num_batched_tokens=64, max_model_len=68, schedule_conservativeness=0.1
)
ADMISSION_EVENTS: dict[int, list[Event]] = {
    0: [
        ("add", f"r{i}", prompt(i, p), m)
        for i, (p, m) in enumerate([(10, 3), (20, 25), (8, 3), (15, 25), (12, 25)])
    ]
}
ADMISSION_OBSERVED: list[ObservedRow] = [
    ("extend", {"r0": 10, "r1": 20}, ("r2", "r3", "r4"), None, (38, 0, 30), 0.07, True),
    ("extend", {"r2": 8}, ("r3", "r4"), None, (30, 0, 38), 0.07, True),
    ("decode", {"r0": 1, "r1": 1, "r2": 1}, ("r3", "r4"), None, (27, 0, 38), 0.0699, True),
    ("decode", {"r0": 1, "r1": 1, "r2": 1}, ("r3", "r4"), None, (24, 22, 20), 0.069799, True),
    ("extend", {"r3": 15}, ("r4",), None, (9, 22, 35), 0.069799, True),
    ("decode", {"r1": 1, "r3": 1}, ("r4",), None, (7, 22, 35), 0.069699, True),
    ("decode", {"r1": 1, "r3": 1}, ("r4",), None, (5, 22, 35), 0.069599, True),
    ("decode", {"r1": 1, "r3": 1}, ("r4",), None, (3, 22, 35), 0.069498, True),
    ("decode", {"r1": 1, "r3": 1}, ("r4",), None, (1, 22, 35), 0.069398, True),
    ("decode", {"r1": 1, "r3": 1}, ("r4",), None, (1, 20, 35), 0.069298, True),
    ("decode", {"r1": 1, "r3": 1}, ("r4",), None, (9, 10, 35), 0.069197, True),
    ("decode", {"r1": 1, "r3": 1}, ("r4",), None, (7, 10, 35), 0.069097, True),
    ("decode", {"r1": 1, "r3": 1}, ("r4",), None, (5, 10, 35), 0.068997, True),
    ("decode", {"r1": 1, "r3": 1}, ("r4",), None, (3, 10, 35), 0.068896, True),
    ("decode", {"r1": 1, "r3": 1}, ("r4",), None, (1, 10, 35), 0.068796, True),
    ("decode", {"r1": 1, "r3": 1}, ("r4",), None, (1, 8, 35), 0.068696, True),
    ("decode", {"r1": 1, "r3": 1}, ("r4",), None, (7, 0, 35), 0.068595, True),
    ("decode", {"r1": 1, "r3": 1}, ("r4",), None, (5, 0, 35), 0.068495, True),
    ("decode", {"r1": 1, "r3": 1}, ("r4",), None, (3, 0, 35), 0.068395, True),
    ("decode", {"r1": 1, "r3": 1}, ("r4",), None, (1, 0, 35), 0.068294, True),
    ("decode", {"r1": 1}, ("r4", "r3"), None, (30, 0, 20), 1.0, False),
    ("decode", {"r1": 1}, ("r4", "r3"), None, (29, 0, 20), 0.9999, True),
    ("decode", {"r1": 1}, ("r4", "r3"), None, (28, 0, 20), 0.999799, True),
    ("decode", {"r1": 1}, ("r4", "r3"), None, (27, 0, 20), 0.999699, True),
    ("decode", {"r1": 1}, ("r4", "r3"), None, (26, 0, 20), 0.999599, True),
    ("decode", {"r1": 1}, ("r4", "r3"), None, (25, 0, 20), 0.999498, True),
    ("decode", {"r1": 1}, ("r4", "r3"), None, (24, 44, 0), 0.999398, True),
    ("extend", {"r4": 12}, ("r3",), None, (12, 44, 12), 0.999398, True),
    ("decode", {"r4": 1}, ("r3",), None, (11, 44, 12), 0.999298, True),
    ("decode", {"r4": 1}, ("r3",), None, (10, 44, 12), 0.999197, True),
    ("decode", {"r4": 1}, ("r3",), None, (9, 44, 12), 0.999097, True),
    ("decode", {"r4": 1}, ("r3",), None, (8, 44, 12), 0.998997, True),
    ("decode", {"r4": 1}, ("r3",), None, (7, 44, 12), 0.998896, True),
    ("decode", {"r4": 1}, ("r3",), None, (6, 44, 12), 0.998796, True),
    ("decode", {"r4": 1}, ("r3",), None, (5, 44, 12), 0.998696, True),
    ("decode", {"r4": 1}, ("r3",), None, (4, 44, 12), 0.998595, True),
    ("decode", {"r4": 1}, ("r3",), None, (3, 44, 12), 0.998495, True),
    ("decode", {"r4": 1}, ("r3",), None, (2, 44, 12), 0.998395, True),
    ("decode", {"r4": 1}, ("r3",), None, (1, 44, 12), 0.998294, True),
    ("decode", {"r4": 1}, ("r3",), None, (0, 44, 12), 0.998194, True),
]

LATCH_CONFIG = replace(
    BASE, num_blocks=40, max_num_batched_tokens=32, max_model_len=40, enable_prefix_caching=False
)
LATCH_EVENTS: dict[int, list[Event]] = {
    0: [("add", "a", prompt(1, 10), 20)],
    1: [("add", "b", prompt(2, 10), 20)],
    3: [("add", "c", prompt(3, 4), 2)],
}
LATCH_OBSERVED: list[ObservedRow] = [
    ("extend", {"a": 10}, (), None, (30, 0, 0), 0.7, False),
    ("decode", {"a": 1}, ("b",), None, (29, 0, 0), 0.698997, True),
    ("decode", {"a": 1}, ("b",), None, (28, 0, 0), 0.697993, True),
    ("decode", {"a": 1}, ("b", "c"), None, (27, 0, 0), 0.69699, True),
    ("decode", {"a": 1}, ("b", "c"), None, (26, 0, 0), 0.695987, True),
    ("decode", {"a": 1}, ("b", "c"), None, (25, 0, 0), 0.694983, True),
    ("decode", {"a": 1}, ("b", "c"), None, (24, 0, 0), 0.69398, True),
    ("decode", {"a": 1}, ("b", "c"), None, (23, 0, 0), 0.692977, True),
    ("decode", {"a": 1}, ("b", "c"), None, (22, 0, 0), 0.691973, True),
    ("decode", {"a": 1}, ("b", "c"), None, (21, 0, 0), 0.69097, True),
    ("decode", {"a": 1}, ("b", "c"), None, (20, 0, 0), 0.689967, True),
    ("decode", {"a": 1}, ("b", "c"), None, (19, 0, 0), 0.688963, True),
    ("decode", {"a": 1}, ("b", "c"), None, (18, 0, 0), 0.68796, True),
    ("decode", {"a": 1}, ("b", "c"), None, (17, 0, 0), 0.686957, True),
    ("decode", {"a": 1}, ("b", "c"), None, (16, 0, 0), 0.685953, True),
    ("decode", {"a": 1}, ("b", "c"), None, (15, 0, 0), 0.68495, True),
    ("decode", {"a": 1}, ("b", "c"), None, (14, 0, 0), 0.683947, True),
    ("decode", {"a": 1}, ("b", "c"), None, (13, 0, 0), 0.682943, True),
    ("decode", {"a": 1}, ("b", "c"), None, (12, 0, 0), 0.68194, True),
    ("decode", {"a": 1}, ("b", "c"), None, (40, 0, 0), 0.680937, True),
    ("extend", {"b": 10, "c": 4}, (), None, (26, 0, 0), 0.680937, False),
    ("decode", {"b": 1, "c": 1}, (), None, (29, 0, 0), 0.679933, False),
    ("decode", {"b": 1}, (), None, (28, 0, 0), 0.67893, False),
    ("decode", {"b": 1}, (), None, (27, 0, 0), 0.677927, False),
    ("decode", {"b": 1}, (), None, (26, 0, 0), 0.676923, False),
    ("decode", {"b": 1}, (), None, (25, 0, 0), 0.67592, False),
    ("decode", {"b": 1}, (), None, (24, 0, 0), 0.674917, False),
    ("decode", {"b": 1}, (), None, (23, 0, 0), 0.673913, False),
    ("decode", {"b": 1}, (), None, (22, 0, 0), 0.67291, False),
    ("decode", {"b": 1}, (), None, (21, 0, 0), 0.671907, False),
]

RETRACT_CONFIG = replace(
    BASE,
    num_blocks=24,
    max_num_batched_tokens=24,
    max_model_len=24,
    schedule_conservativeness=0.1,
    enable_prefix_caching=False,
)
RETRACT_EVENTS: dict[int, list[Event]] = {
    0: [
        ("add", "a", prompt(1, 6), 12),
        ("add", "b", prompt(2, 4), 12),
        ("add", "c", prompt(3, 5), 12),
    ]
}
RETRACT_OBSERVED: list[ObservedRow] = [
    ("extend", {"a": 6}, ("b", "c"), None, (18, 0, 0), 0.07, True),
    ("extend", {"b": 4}, ("c",), None, (14, 0, 0), 0.07, True),
    ("decode", {"a": 1, "b": 1}, ("c",), None, (12, 0, 0), 0.0699, True),
    ("decode", {"a": 1, "b": 1}, ("c",), None, (10, 0, 0), 0.069799, True),
    ("decode", {"a": 1, "b": 1}, ("c",), None, (8, 0, 0), 0.069699, True),
    ("decode", {"a": 1, "b": 1}, ("c",), None, (6, 0, 0), 0.069599, True),
    ("decode", {"a": 1, "b": 1}, ("c",), None, (4, 0, 0), 0.069498, True),
    ("decode", {"a": 1, "b": 1}, ("c",), None, (2, 0, 0), 0.069398, True),
    ("decode", {"a": 1, "b": 1}, ("c",), None, (0, 0, 0), 0.069298, True),
    ("decode", {"b": 1}, ("c", "a"), None, (12, 0, 0), 1.0, False),
    ("decode", {"b": 1}, ("c", "a"), None, (11, 0, 0), 0.9999, True),
    ("decode", {"b": 1}, ("c", "a"), None, (10, 0, 0), 0.999799, True),
    ("decode", {"b": 1}, ("c", "a"), None, (24, 0, 0), 0.999699, True),
    ("extend", {"c": 5}, ("a",), None, (19, 0, 0), 0.999699, True),
    ("decode", {"c": 1}, ("a",), None, (18, 0, 0), 0.999599, True),
    ("decode", {"c": 1}, ("a",), None, (17, 0, 0), 0.999498, True),
    ("decode", {"c": 1}, ("a",), None, (16, 0, 0), 0.999398, True),
    ("decode", {"c": 1}, ("a",), None, (15, 0, 0), 0.999298, True),
    ("decode", {"c": 1}, ("a",), None, (14, 0, 0), 0.999197, True),
    ("decode", {"c": 1}, ("a",), None, (13, 0, 0), 0.999097, True),
    ("decode", {"c": 1}, ("a",), None, (12, 0, 0), 0.998997, True),
    ("decode", {"c": 1}, ("a",), None, (11, 0, 0), 0.998896, True),
    ("decode", {"c": 1}, ("a",), None, (10, 0, 0), 0.998796, True),
    ("decode", {"c": 1}, ("a",), None, (9, 0, 0), 0.998696, True),
    ("decode", {"c": 1}, ("a",), None, (24, 0, 0), 0.998595, True),
    ("extend", {"a": 14}, (), None, (10, 0, 0), 0.998595, True),
    ("decode", {"a": 1}, (), None, (9, 0, 0), 0.998495, False),
    ("decode", {"a": 1}, (), None, (8, 0, 0), 0.998395, False),
    ("decode", {"a": 1}, (), None, (24, 0, 0), 0.998294, False),
]

CHUNKED_CONFIG = BASE
CHUNKED_EVENTS: dict[int, list[Event]] = {
    0: [("add", "a", prompt(1, 20), 2), ("add", "b", prompt(2, 12), 2)]
}
CHUNKED_OBSERVED: list[ObservedRow] = [
    ("extend", {"a": 8}, ("b",), "a", (56, 0, 0), 0.7, False),
    ("extend", {"a": 8}, ("b",), "a", (48, 0, 8), 0.7, False),
    ("extend", {"a": 4, "b": 4}, (), "b", (40, 0, 20), 0.7, False),
    ("extend", {"b": 8}, (), None, (32, 0, 32), 0.7, False),
    ("decode", {"a": 1, "b": 1}, (), None, (30, 34, 0), 0.698997, False),
]

RADIX_CONFIG = replace(
    BASE, num_blocks=32, max_num_batched_tokens=32, max_num_seqs=2, max_model_len=24
)
RADIX_EVENTS: dict[int, list[Event]] = {
    0: [("add", "a", [*SHARED, 500, 501], 2)],
    3: [("add", "b", [*SHARED, 600], 2)],
    6: [("add", "c", prompt(9, 14), 2)],
    8: [("add", "d", prompt(8, 17), 2)],
}
RADIX_OBSERVED: list[ObservedRow] = [
    ("extend", {"a": 14}, (), None, (18, 0, 14), 0.7, False),
    ("decode", {"a": 1}, (), None, (17, 15, 0), 0.698997, False),
    (None, {}, (), None, (17, 15, 0), 0.7, False),
    ("extend", {"b": 1}, (), None, (16, 3, 13), 0.7, False),
    ("decode", {"b": 1}, (), None, (15, 17, 0), 0.698997, False),
    (None, {}, (), None, (15, 17, 0), 0.7, False),
    ("extend", {"c": 14}, (), None, (1, 17, 14), 0.7, False),
    ("decode", {"c": 1}, (), None, (0, 32, 0), 0.698997, False),
    ("extend", {"d": 17}, (), None, (0, 15, 17), 0.698997, False),
    ("decode", {"d": 1}, (), None, (0, 32, 0), 0.697993, False),
]

MIXED_CONFIG = replace(BASE, enable_mixed_chunk=True)
MIXED_EVENTS: dict[int, list[Event]] = {
    0: [("add", "a", prompt(1, 5), 6)],
    2: [("add", "b", prompt(2, 12), 3)],
}
MIXED_OBSERVED: list[ObservedRow] = [
    ("extend", {"a": 5}, (), None, (59, 0, 5), 0.7, False),
    ("decode", {"a": 1}, (), None, (58, 0, 5), 0.698997, False),
    ("mixed", {"b": 7, "a": 1}, (), "b", (50, 0, 5), 0.698997, False),
    ("mixed", {"b": 5, "a": 1}, (), None, (44, 0, 17), 0.698997, False),
    ("decode", {"b": 1, "a": 1}, (), None, (42, 0, 17), 0.697993, False),
    ("decode", {"b": 1, "a": 1}, (), None, (40, 24, 0), 0.69699, False),
]

OVERLAP_RETRACT_CONFIG = replace(RETRACT_CONFIG, async_scheduling=True)
OVERLAP_RETRACT_EVENTS: dict[int, list[Event]] = RETRACT_EVENTS
OVERLAP_RETRACT_OBSERVED: list[ObservedRow] = [
    ("extend", {"a": 6}, ("b", "c"), None, (18, 0, 0), 0.07, True),
    ("extend", {"b": 4}, ("c",), None, (14, 0, 0), 0.07, True),
    ("decode", {"a": 1, "b": 1}, ("c",), None, (12, 0, 0), 0.0699, True),
    ("decode", {"a": 1, "b": 1}, ("c",), None, (10, 0, 0), 0.069799, True),
    ("decode", {"a": 1, "b": 1}, ("c",), None, (8, 0, 0), 0.069699, True),
    ("decode", {"a": 1, "b": 1}, ("c",), None, (6, 0, 0), 0.069599, True),
    ("decode", {"a": 1, "b": 1}, ("c",), None, (4, 0, 0), 0.069498, True),
    ("decode", {"a": 1, "b": 1}, ("c",), None, (2, 0, 0), 0.069398, True),
    ("decode", {"a": 1, "b": 1}, ("c",), None, (0, 0, 0), 0.069298, True),
    ("decode", {"b": 1}, ("c", "a"), None, (12, 0, 0), 1.0, False),
    ("decode", {"b": 1}, ("c", "a"), None, (11, 0, 0), 0.9999, True),
    ("decode", {"b": 1}, ("c", "a"), None, (10, 0, 0), 0.999799, True),
    ("decode", {"b": 1}, ("c", "a"), None, (9, 0, 0), 0.999699, True),
    (None, {}, ("c", "a"), None, (24, 0, 0), 0.999699, False),
    ("extend", {"c": 5}, ("a",), None, (19, 0, 0), 0.999699, True),
    ("decode", {"c": 1}, ("a",), None, (18, 0, 0), 0.999599, True),
    ("decode", {"c": 1}, ("a",), None, (17, 0, 0), 0.999498, True),
    ("decode", {"c": 1}, ("a",), None, (16, 0, 0), 0.999398, True),
    ("decode", {"c": 1}, ("a",), None, (15, 0, 0), 0.999298, True),
    ("decode", {"c": 1}, ("a",), None, (14, 0, 0), 0.999197, True),
    ("decode", {"c": 1}, ("a",), None, (13, 0, 0), 0.999097, True),
    ("decode", {"c": 1}, ("a",), None, (12, 0, 0), 0.998997, True),
    ("decode", {"c": 1}, ("a",), None, (11, 0, 0), 0.998896, True),
    ("decode", {"c": 1}, ("a",), None, (10, 0, 0), 0.998796, True),
    ("decode", {"c": 1}, ("a",), None, (9, 0, 0), 0.998696, True),
    ("decode", {"c": 1}, ("a",), None, (8, 0, 0), 0.998595, True),
    (None, {}, ("a",), None, (24, 0, 0), 0.998595, False),
    ("extend", {"a": 13}, (), None, (11, 0, 0), 0.998595, True),
    ("decode", {"a": 1}, (), None, (10, 0, 0), 0.998495, False),
    ("decode", {"a": 1}, (), None, (9, 0, 0), 0.998395, False),
    ("decode", {"a": 1}, (), None, (8, 0, 0), 0.998294, False),
    ("decode", {"a": 1}, (), None, (7, 0, 0), 0.998194, False),
    (None, {}, (), None, (24, 0, 0), 0.998194, False),
]

PAGED_CONFIG = replace(
    BASE,
    block_size=4,
    num_blocks=10,
    max_num_batched_tokens=40,
    max_model_len=32,
    schedule_conservativeness=0.1,
)
PAGED_EVENTS: dict[int, list[Event]] = {
    0: [("add", "a", prompt(1, 9), 6), ("add", "b", prompt(2, 7), 6)]
}
PAGED_OBSERVED: list[ObservedRow] = [
    ("extend", {"a": 9, "b": 7}, (), None, (20, 0, 12), 0.07, True),
    ("decode", {"a": 1, "b": 1}, (), None, (20, 0, 12), 0.0699, False),
    ("decode", {"a": 1, "b": 1}, (), None, (16, 0, 12), 0.069799, False),
    ("decode", {"a": 1, "b": 1}, (), None, (16, 0, 12), 0.069699, False),
    ("decode", {"a": 1, "b": 1}, (), None, (12, 0, 12), 0.069599, False),
    ("decode", {"a": 1, "b": 1}, (), None, (16, 24, 0), 0.069498, False),
]

ABORT_CONFIG = BASE
ABORT_EVENTS: dict[int, list[Event]] = {
    0: [("add", "a", prompt(1, 20), 5), ("add", "b", prompt(2, 4), 6)],
    1: [("abort", "a")],
    3: [("abort", "b")],
}
ABORT_OBSERVED: list[ObservedRow] = [
    ("extend", {"a": 8}, ("b",), "a", (56, 0, 0), 0.7, False),
    ("extend", {"b": 4}, (), None, (60, 0, 4), 0.7, False),
    ("decode", {"b": 1}, (), None, (59, 0, 4), 0.698997, False),
    ("decode", {"b": 1}, (), None, (58, 6, 0), 0.697993, False),
    (None, {}, (), None, (58, 6, 0), 0.7, False),
]

# a's 37-token prompt leaves no room in 44 slots for a page more: SGLang clips its
# max_new_tokens to 0. Its extend batch then becomes a running batch that does not
# decode (prefill only) while its result is in flight: the next step idles.
PREFILL_ONLY_CONFIG = replace(
    BASE,
    block_size=4,
    num_blocks=11,
    max_num_batched_tokens=78,
    max_model_len=44,
    schedule_conservativeness=0.3,
    enable_chunked_prefill=False,
    async_scheduling=True,
)
PREFILL_ONLY_EVENTS: dict[int, list[Event]] = {
    0: [("add", "a", prompt(1, 37), 10), ("add", "b", prompt(2, 11), 9)]
}
PREFILL_ONLY_OBSERVED: list[ObservedRow] = [
    ("extend", {"a": 37}, ("b",), None, (4, 0, 0), 0.21, True),
    (None, {}, ("b",), None, (8, 36, 0), 0.21, True),
    ("extend", {"b": 11}, (), None, (32, 0, 0), 0.21, False),
    ("decode", {"b": 1}, (), None, (32, 0, 8), 0.209699, False),
    ("decode", {"b": 1}, (), None, (28, 0, 8), 0.209398, False),
    ("decode", {"b": 1}, (), None, (28, 0, 8), 0.209097, False),
    ("decode", {"b": 1}, (), None, (28, 0, 8), 0.208796, False),
    ("decode", {"b": 1}, (), None, (28, 0, 8), 0.208495, False),
]

SCENARIOS = {
    "prefill_only": (PREFILL_ONLY_CONFIG, PREFILL_ONLY_EVENTS, PREFILL_ONLY_OBSERVED),
    "admission": (ADMISSION_CONFIG, ADMISSION_EVENTS, ADMISSION_OBSERVED),
    "latch": (LATCH_CONFIG, LATCH_EVENTS, LATCH_OBSERVED),
    "retract": (RETRACT_CONFIG, RETRACT_EVENTS, RETRACT_OBSERVED),
    "chunked": (CHUNKED_CONFIG, CHUNKED_EVENTS, CHUNKED_OBSERVED),
    "radix": (RADIX_CONFIG, RADIX_EVENTS, RADIX_OBSERVED),
    "mixed": (MIXED_CONFIG, MIXED_EVENTS, MIXED_OBSERVED),
    "overlap_retract": (OVERLAP_RETRACT_CONFIG, OVERLAP_RETRACT_EVENTS, OVERLAP_RETRACT_OBSERVED),
    "paged": (PAGED_CONFIG, PAGED_EVENTS, PAGED_OBSERVED),
    "abort": (ABORT_CONFIG, ABORT_EVENTS, ABORT_OBSERVED),
}


def run(name: str) -> tuple[Driver, list[Row]]:
    config, events, observed = SCENARIOS[name]
    driver = Driver(config)
    return driver, driver.run(events, len(observed))


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_reference_reproduces_sglang_step_for_step(name: str) -> None:
    _, rows = run(name)
    observed = [as_row(row) for row in SCENARIOS[name][2]]
    for step, (mine, theirs) in enumerate(zip(rows, observed, strict=True)):
        assert mine == theirs, f"{name} step {step}"


class TestWhatTheExamplesShow:
    def test_admission_reserves_each_future_and_the_latch_waits_for_a_departure(self) -> None:
        # LATCH: b (10 + 20 new + 1 page = 31 tokens) does not fit beside a, whose
        # 19 remaining tokens count at new_token_ratio 0.7: the latch closes, and
        # the short c queued behind b waits too, though it would fit (head of line).
        _, rows = run("latch")
        assert rows[1].waiting == ("b",) and rows[1].latch
        assert all(row.batch == "decode" for row in rows[1:20])
        # a finishes at step 19; the next step admits b and c in one extend batch.
        assert rows[20].batch == "extend" and rows[20].scheduled == {"b": 10, "c": 4}

    def test_new_token_ratio_decays_per_decode_and_jumps_after_a_retraction(self) -> None:
        _, rows = run("retract")
        step = (0.07 - 0.07 * 0.14) / 600
        assert rows[2].ratio == round(0.07 - step, 6)
        # Step 9 retracts a; the survivor b has 8 outputs of 12: (8 + 20) / 13 > 1.
        assert rows[9].ratio == 1.0

    def test_the_retraction_victim_has_fewest_outputs_then_longest_prompt(self) -> None:
        # a (prompt 6) and b (prompt 4) both hold 8 outputs when their decode no longer
        # fits: a goes, to the back of the queue behind c, keeping its outputs.
        driver, rows = run("retract")
        assert rows[9].scheduled == {"b": 1} and rows[9].waiting == ("c", "a")
        assert driver.outputs[9].preempted_req_ids == {"a"}
        a = driver.requests["a"]
        assert a.num_output_tokens == 12 and a.num_preemptions == 1
        # Re-admitted at step 25 it recomputes prompt and outputs (6 + 8) at once.
        assert rows[25].scheduled == {"a": 14}

    def test_overlap_drops_the_retracted_requests_output_in_flight(self) -> None:
        # Under overlap a's decode of step 8 was in flight when step 9 retracted it:
        # that token is dropped, so a resumes with 7 outputs (6 + 7 = 13 to recompute).
        _, rows = run("overlap_retract")
        assert rows[9].waiting == ("c", "a")
        assert rows[27].scheduled == {"a": 13}

    def test_one_chunked_request_whose_next_chunk_comes_first(self) -> None:
        # Chunks of 8: a takes steps 0-1 alone (b waits: only one request is chunked);
        # step 2 finishes a (4) and starts b, which becomes the chunked request.
        _, rows = run("chunked")
        assert [row.chunked for row in rows[:4]] == ["a", "a", "b", None]
        assert rows[2].scheduled == {"a": 4, "b": 4}
        # Between chunks a's computed prefix is in the radix tree, locked (protected).
        assert rows[1].slots == (48, 0, 8)

    def test_a_radix_hit_extends_only_the_uncached_tail(self) -> None:
        # b shares a's first 12 tokens: 12 of its 13 are cached, it computes one.
        _, rows = run("radix")
        assert rows[3].scheduled == {"b": 1}

    def test_the_radix_cache_evicts_least_recently_used_leaves(self) -> None:
        # d (17 tokens) needs 15 slots of the tree: c's 15-token leaf, used last,
        # stays; a's and b's older branch (15 tokens with its shared prefix) goes.
        driver, rows = run("radix")
        assert rows[7].slots == (0, 32, 0)
        assert rows[8].slots == (0, 15, 17)
        tree = driver.scheduler.kv.tree
        assert tree.match_prefix(prompt(9, 14))[0] == 14
        assert tree.match_prefix(SHARED)[0] == 0

    def test_mixed_chunk_decodes_the_running_requests_inside_the_prefill(self) -> None:
        _, rows = run("mixed")
        assert rows[2].batch == "mixed" and rows[2].scheduled == {"b": 7, "a": 1}
        # The mixed batch joins the running batch prefills first: b decodes before a.
        assert list(rows[4].scheduled) == ["b", "a"]

    def test_an_abort_of_a_running_request_lands_one_more_token(self) -> None:
        # a was chunked: aborted at step 1, it is dropped before its next chunk. b was
        # running: aborted at step 3, that step's decode still lands its token.
        driver, rows = run("abort")
        assert rows[1].scheduled == {"b": 4} and rows[1].chunked is None
        a, b = driver.requests["a"], driver.requests["b"]
        assert a.status is RequestStatus.FINISHED_ABORTED and a.num_output_tokens == 0
        assert b.status is RequestStatus.FINISHED_ABORTED and b.num_output_tokens == 3
        assert "a" in driver.outputs[2].finished_req_ids

    def test_a_prefill_only_running_batch_does_not_decode(self) -> None:
        driver, rows = run("prefill_only")
        assert driver.requests["a"].max_tokens == 1  # SGLang's 0, at least one token
        # Step 1: a's result is in flight and a samples nothing more: no decode, the
        # latch stays closed; b waits until a's slots are cached and evictable.
        assert rows[1].batch is None and rows[1].latch
        assert rows[2].scheduled == {"b": 11}


class TestTheDoor:
    def test_a_prompt_of_max_model_len_minus_6_is_refused(self) -> None:
        from schedspec.spec import Request, RequestError

        scheduler = SGLangScheduler(BASE)
        scheduler.add_request(Request("ok", prompt(1, 57), 4))
        with pytest.raises(RequestError, match="at most 57 tokens") as err:
            scheduler.add_request(Request("long", prompt(1, 58), 4))
        assert err.value.field == "prompt_token_ids"

    def test_max_new_tokens_is_clipped_to_the_context(self) -> None:
        from schedspec.spec import Request

        scheduler = SGLangScheduler(BASE)
        request = Request("r", prompt(1, 50), 100)
        scheduler.add_request(request)
        # max_req_len 63 - prompt 50 - 1 = 12 new tokens at most.
        assert request.max_tokens == 12


def test_s4_the_reference_cuts_the_chunk_where_sglang_runs_out_of_memory() -> None:
    """docs/FINDINGS.md S4, docs/SPEC.md "A chunk the pool cannot hold": under
    schedule_conservativeness 0.1, at the trace's last step one free page (2 slots) is
    left and r62 has 3 prompt tokens to go. The reservations leave nothing, so SGLang
    0.5.23 takes the whole rest (2 pages) and raises "Prefill out of memory"
    (tests/test_sglang_adapter.py replays it there). The reference cuts the chunk to the
    one page the pool can give, decodes the running requests beside it (mixed), holds
    every invariant of the sglang profile, and finishes every request."""
    trace = Trace.load(FINDINGS / "sglang-prefill-out-of-memory-when-aggressive.json")
    checked = CheckedEngine.from_factory(reference_engine, trace.config, "sglang", trace.model)
    *before, last = trace.events
    for event in before:
        checked.apply(event)
    assert len(checked.state.kv.free_block_ids) == 1
    assert checked.state.config.schedule_conservativeness == 0.1
    r62 = checked.state.requests["r62"]
    assert (r62.num_computed_tokens, len(r62.prompt_token_ids)) == (62, 65)
    checked.apply(last)
    assert checked.state.requests["r62"].num_computed_tokens == 64  # one page of 2
    assert checked.state.sglang is not None and checked.state.sglang.last_batch_kind == "mixed"
    for _ in range(20):
        checked.apply(Step())
    assert not checked.state.requests


def test_s4_a_chunk_with_no_page_to_go_to_is_held_back_while_the_decode_fits() -> None:
    """docs/SPEC.md "A chunk the pool cannot hold", a worked example (found by a search
    over small configs): pages of 2, 37 pages, chunks of 3, conservativeness 0.1, mixed
    chunks; r0 (4 tokens, 35 new) decodes beside r1's chunks (48 tokens). Step 25's mixed
    step takes the last free page. At step 26 r1's chunk (page-aligned, 46 tokens done)
    could get no slot, so it is held back (SGLang would take a whole chunk and raise),
    nothing is admitted, and r0 decodes into the free slot of its last page; r1 stays
    the chunked request. At step 27 r0's decode needs a page: r1, held back again and
    with no outputs, is the first victim (22 pages freed) and r0 decodes."""
    config = replace(
        BASE,
        block_size=2,
        num_blocks=37,
        max_num_batched_tokens=3,
        max_num_seqs=3,
        max_model_len=74,
        enable_prefix_caching=False,
        schedule_conservativeness=0.1,
        enable_mixed_chunk=True,
    )
    events: dict[int, list[Event]] = {
        1: [("add", "r0", prompt(0, 4), 35)],
        2: [("add", "r1", prompt(1, 48), 14)],
    }
    driver = Driver(config)
    rows = driver.run(events, 28)
    assert [(r.batch, r.scheduled, r.chunked, r.waiting, r.slots[0]) for r in rows[25:28]] == [
        ("mixed", {"r1": 2, "r0": 1}, "r1", (), 0),
        ("decode", {"r0": 1}, "r1", (), 0),  # held back; r0 fits its last page
        ("decode", {"r0": 1}, None, ("r1",), 44),  # held back, then retracted
    ]
    assert driver.outputs[26].preempted_req_ids == frozenset()
    assert driver.outputs[27].preempted_req_ids == frozenset({"r1"})


def test_s4_a_held_back_chunk_is_the_first_victim_of_a_decode_that_does_not_fit() -> None:
    """docs/SPEC.md "A chunk the pool cannot hold", a worked example (found by a search
    over small configs): 38 slots, chunks of 2, conservativeness 0.1, mixed chunks; r0
    (11 tokens, 27 new) decodes beside r1's chunks (18 tokens). At step 20 one slot is
    left: r1's chunk is cut to it (SGLang takes 2 and raises) and r0's decode no longer
    fits beside it. At step 21 r1's chunk has no slot, so it is held back, and r0's decode
    does not fit either: r1, which holds 17 slots and has no outputs, is retracted first
    (to the back of the queue, the ratio jumping as after any retraction), and r0 decodes.
    Without that, SGLang's rule for a lone decode that does not fit would abort r0."""
    config = replace(
        BASE,
        num_blocks=38,
        max_num_batched_tokens=2,
        max_num_seqs=2,
        max_model_len=38,
        enable_prefix_caching=False,
        schedule_conservativeness=0.1,
        enable_mixed_chunk=True,
    )
    events: dict[int, list[Event]] = {
        1: [("add", "r0", prompt(0, 11), 27)],
        2: [("add", "r1", prompt(1, 18), 2)],
    }
    driver = Driver(config)
    rows = driver.run(events, 23)
    assert [(r.batch, r.scheduled, r.chunked, r.slots[0]) for r in rows[19:22]] == [
        ("mixed", {"r1": 1, "r0": 1}, "r1", 1),
        ("extend", {"r1": 1}, "r1", 0),  # cut to the last slot; no room for r0's decode
        ("decode", {"r0": 1}, None, 13),  # r1 held back, then retracted
    ]
    assert rows[21].waiting == ("r1",) and rows[21].ratio == 1.0
    assert driver.outputs[21].preempted_req_ids == frozenset({"r1"})
    assert driver.requests["r1"].status is RequestStatus.PREEMPTED
