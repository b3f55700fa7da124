"""Block hashes: the engine's own names for cached blocks, as the spec's.

The spec names a full block's content by the chained hash of the tokens up to and
including it (spec.block_hash); an engine has its own hash (vLLM: SHA-256 over pickled
tokens), or none it exposes (SGLang's radix tree). Either way the content of a request's
block i is known from the request's own tokens: OwnHashes keeps, per live request, the
spec's hashes of its full blocks, extended as its tokens grow.

HashTranslator pairs the engine's hash of a request's block i with the spec's hash of the
same block, and remembers the pair: a freed block keeps its cached content, and the pool
lists it under the engine's hash long after the request is gone. Learn a request's
hashes whenever its tokens may have grown (in snapshot(), and right after any call that
can cache a block and free it at once: a request finishing inside update_from_output,
a victim inside schedule()). An engine that gives one hash to two different contents is
refused with HashCollisionError: its prefix cache would hand a request someone else's KV.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

from schedspec.spec import BlockHash, extend_block_hashes


class HashCollisionError(RuntimeError):
    """The engine gave two different contents one hash (or one content id)."""


class OwnHashes:
    """Per live request (by the adapter's key for it): the spec's hashes of its full
    blocks so far."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._hashes: dict[str, list[BlockHash]] = {}

    def of(self, key: str, tokens: Sequence[int]) -> list[BlockHash]:
        """The hashes of the full blocks of `tokens` (the request's known tokens: they only
        grow while it lives), extended from the ones computed before."""
        return extend_block_hashes(self._hashes.setdefault(key, []), tokens, self.block_size)

    def forget(self, key: str) -> None:
        self._hashes.pop(key, None)

    def keep_only(self, live: Iterable[str]) -> None:
        """Forget every request not in `live`."""
        keep = set(live)
        for key in [k for k in self._hashes if k not in keep]:
            del self._hashes[key]


class HashTranslator:
    """The engine's block hashes -> the spec's, learned from the requests' own tokens."""

    def __init__(self, block_size: int) -> None:
        self._own = OwnHashes(block_size)
        self._spec: dict[Hashable, BlockHash] = {}
        self._learned: dict[str, int] = {}  # per request: engine hashes paired so far

    def learn(self, key: str, engine_hashes: Sequence[Hashable], tokens: Sequence[int]) -> None:
        """Pair the request's engine hash of each block i with the spec's hash of its
        block i (from `tokens`, its known tokens)."""
        done = self._learned.get(key, 0)
        if len(engine_hashes) <= done:
            return
        own = self._own.of(key, tokens)
        if len(engine_hashes) > len(own):
            raise RuntimeError(
                f"request {key!r}: the engine hashes {len(engine_hashes)} blocks, but its "
                f"tokens fill only {len(own)}"
            )
        for i in range(done, len(engine_hashes)):
            known = self._spec.setdefault(engine_hashes[i], own[i])
            if known != own[i]:
                raise HashCollisionError(
                    f"request {key!r}: the engine gives block {i} the hash of other content"
                )
        self._learned[key] = len(engine_hashes)

    def spec_of(self, engine_hash: Hashable) -> BlockHash:
        """The spec's hash of a block the engine names `engine_hash`."""
        found = self._spec.get(engine_hash)
        if found is None:
            raise RuntimeError(
                f"a block carries the engine hash {engine_hash!r}, which no request's "
                "tokens produced (learn each request's hashes before its blocks are freed)"
            )
        return found

    def spec_or_none(self, engine_hash: Hashable | None) -> BlockHash | None:
        """spec_of, with None (an uncached block) kept None."""
        return None if engine_hash is None else self.spec_of(engine_hash)

    def forget(self, key: str) -> None:
        """The request finished: its own hashes go; the pairs it taught stay."""
        self._own.forget(key)
        self._learned.pop(key, None)
