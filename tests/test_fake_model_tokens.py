"""The fake model's tokens and draft guesses are a pure function of (seed, request id,
position): 64 bits of blake2b over the repr of those parts. The model keeps each
request's hash state after the common head; that must give the same bits as hashing
the whole repr, or every recorded trace and fixed-seed run would change."""

from __future__ import annotations

import hashlib

import pytest

from schedspec.engines.fake_model import FakeModel


def _bits(*parts: object) -> int:
    """The definition, written out: blake2b-64 of repr(parts), little-endian."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@pytest.mark.parametrize("seed", [0, 7, -3, 2**70])
@pytest.mark.parametrize("request_id", ["req-0", "it's", 'a "b"', "ünï\ncode", ""])
def test_tokens_and_guesses_are_the_bits_of_the_repr(seed: int, request_id: str) -> None:
    model = FakeModel(seed=seed, vocab_size=1000, draft_acceptance=0.5)
    for position in (0, 1, 57, 10**12):
        assert model.token_at(request_id, position) == _bits(seed, request_id, position) % 1000
        guess = _bits(seed, request_id, position, "draft") % 1000 < 500
        true = _bits(seed, request_id, position) % 1000
        assert model.draft_at(request_id, position) == (true if guess else (true + 1) % 1000)


def test_two_requests_and_two_seeds_do_not_share_a_state() -> None:
    model = FakeModel(seed=1)
    first = [model.token_at("a", p) for p in range(5)]
    assert [model.token_at("b", p) for p in range(5)] != first
    model.seed = 2  # a changed seed is a different model, not the cached one
    assert [model.token_at("a", p) for p in range(5)] != first
    model.seed = 1
    assert [model.token_at("a", p) for p in range(5)] == first
