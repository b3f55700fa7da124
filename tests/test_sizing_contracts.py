"""The reference's arithmetic (schedspec/reference/sizing.py): worked examples, and
its PEP 316 contracts checked by CrossHair over all paths.

The contracts must have teeth: each seeded mistake below (two of them the
mutant catalogue's own sizing.py mutants) makes CrossHair report a
counterexample.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from schedspec.reference import sizing
from schedspec.reference.contracts import SIZING, check_contracts
from tests.mutants.catalogue import MUTANTS

# ----------------------------------------------------------------- worked examples


def test_cdiv_rounds_up() -> None:
    assert [sizing.cdiv(a, 4) for a in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]


def test_long_prefill_cap() -> None:
    assert sizing.apply_long_prefill_cap(100, 32) == 32  # a long prefill is cut
    assert sizing.apply_long_prefill_cap(10, 32) == 10  # a short one is not
    assert sizing.apply_long_prefill_cap(100, 0) == 100  # cap 0: a lone request


def test_running_new_tokens_takes_the_tightest_bound() -> None:
    # 100 remaining, cap 32, budget 20, room 50: the budget binds.
    assert sizing.running_new_tokens(100, 32, 20, 50) == 20
    # Room before max_model_len binds: 3 positions left.
    assert sizing.running_new_tokens(100, 0, 512, 3) == 3
    # A decode with 2 drafts: 3 tokens.
    assert sizing.running_new_tokens(3, 32, 512, 50) == 3


def test_prefix_hit_never_covers_the_last_token() -> None:
    # 32 tokens in blocks of 16: the second block holds the last token.
    assert sizing.max_prefix_hit_blocks(32, 16) == 1
    assert sizing.max_prefix_hit_blocks(33, 16) == 2
    assert sizing.max_prefix_hit_blocks(16, 16) == 0


def test_num_slots_adds_lookahead_up_to_max_model_len() -> None:
    assert sizing.num_slots(10, 1, 2, 100) == 13
    assert sizing.num_slots(97, 2, 4, 100) == 100
    assert sizing.num_slots(32, 5, 0, 100) == 37  # a 32-token prefix hit


def test_blocks_to_allocate() -> None:
    # Holds 2 blocks of 4 (8 slots), needs 13 slots: 2 fresh blocks.
    assert sizing.blocks_to_allocate(2, 13, 0, 0, 4) == 2
    # Admission with 3 hit blocks, one of them free: 1 fresh + 1 evicted from the queue.
    assert sizing.blocks_to_allocate(0, 16, 3, 1, 4) == 2
    # Rejected drafts left a longer table than needed: nothing fresh.
    assert sizing.blocks_to_allocate(5, 9, 0, 0, 4) == 0


def test_drafts_ride_only_past_the_known_tokens() -> None:
    # 10 known, 9 computed, 3 scheduled: the decode token plus 2 drafts.
    assert sizing.num_drafts_to_schedule(3, 9, 10) == 2
    # A chunk that stops inside the known tokens carries none.
    assert sizing.num_drafts_to_schedule(4, 0, 10) == 0


def test_rollback_of_rejected_drafts() -> None:
    # 3 drafts verified, 2 accepted (3 sampled): 1 rejected slot rolled back.
    assert sizing.rolled_back_computed(20, 3, 3) == 19
    assert sizing.rolled_back_computed(20, 3, 4) == 20  # all accepted
    assert sizing.rolled_back_computed(20, 3, 1) == 17  # all rejected


# ----------------------------------------------------------------- CrossHair


def test_crosshair_confirms_every_postcondition() -> None:
    result = check_contracts(SIZING)
    assert not result.failed, result.stdout + result.stderr
    num_posts = len(re.findall(r"^\s+post:", SIZING.read_text(), re.MULTILINE))
    assert num_posts >= 20
    assert result.confirmed == num_posts, result.stdout
    assert result.unconfirmed == []


def _catalogue_edits() -> list[tuple[str, str, str]]:
    """The mutant catalogue's edits of sizing.py, as (id, old, new)."""
    return [
        (m.id, edit.old, edit.new) for m in MUTANTS if m.file == "sizing.py" for edit in m.edits
    ]


SEEDED = [
    *_catalogue_edits(),
    ("cdiv-floor", "    return -(-a // b)\n", "    return a // b\n"),
    (
        "cap-ignores-cap",
        "    return cap if 0 < cap < num_tokens else num_tokens\n",
        "    return num_tokens\n",
    ),
    (
        "budget-not-bounding",
        "    if num_new > token_budget:\n        num_new = token_budget\n",
        "",
    ),
    (
        "lookahead-past-max-model-len",
        "    return slots if slots <= max_model_len else max_model_len  # not min(): per request "
        "per step\n",
        "    return slots\n",
    ),
    (
        "evictable-hits-free",
        "    return max(missing, 0) + evictable\n",
        "    return max(missing, 0)\n",
    ),
    (
        "drafts-not-clipped",
        "    return max(num_new + num_computed - num_tokens, 0)\n",
        "    return num_new + num_computed - num_tokens\n",
    ),
]


def test_seeded_list_names_both_catalogue_mutants() -> None:
    assert {"prefix-hit-covers-last-token", "rejected-drafts-kept"} <= {s[0] for s in SEEDED}


@pytest.mark.parametrize(("name", "old", "new"), SEEDED, ids=[s[0] for s in SEEDED])
def test_crosshair_finds_each_seeded_mistake(name: str, old: str, new: str, tmp_path: Path) -> None:
    source = SIZING.read_text()
    assert source.count(old) == 1, f"{name}: snippet not in sizing.py exactly once"
    mutated = tmp_path / "sizing_mutant.py"
    mutated.write_text(source.replace(old, new))
    result = check_contracts(mutated)
    assert result.failed, f"{name}: CrossHair found nothing\n{result.stdout}"
    assert result.errors, result.stdout
