"""schedspec adapter for toyserve, on the adapter kit: the kit derives the bookkeeping,
this file translates the calls and reads toyserve's state (docs/ADAPTERS.md)."""

from collections.abc import Hashable, Mapping, Sequence

from toyserve import Engine, EngineConfig, Finish, SeqState
from toyserve import Sequence as ToySequence

from schedspec.adapters.kit import EngineRequest, KitAdapter
from schedspec.engines.capabilities import Capability
from schedspec.spec import KVState, Request, RequestOutput, RequestStatus, SchedulerConfig
from schedspec.spec.invariants import Profile

STATUS = {
    SeqState.QUEUED: RequestStatus.WAITING,
    SeqState.ACTIVE: RequestStatus.RUNNING,
    SeqState.PAUSED: RequestStatus.PREEMPTED,
}
FINISH = {
    Finish.STOP: RequestStatus.FINISHED_STOPPED,
    Finish.LENGTH: RequestStatus.FINISHED_LENGTH_CAPPED,
    Finish.CANCELLED: RequestStatus.FINISHED_ABORTED,
}


class ToyServeAdapter(KitAdapter):
    # Any correct engine claims safety; toyserve makes none of vLLM V1's exact choices.
    profiles: frozenset[Profile] = frozenset({"safety"})
    # What toyserve has: configs draw these knobs, and no others (no drafts, no async,
    # no priority, no watermark, no long-prefill cap, no KV connector).
    capabilities = frozenset({Capability.CHUNKED_PREFILL, Capability.PREFIX_CACHING})

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.engine = Engine(
            EngineConfig(
                block_size=config.block_size,
                num_blocks=config.num_blocks,
                token_budget=config.max_num_batched_tokens,
                max_seqs=config.max_num_seqs,
                max_len=config.max_model_len,
                chunked_prefill=config.enable_chunked_prefill,
                prefix_caching=config.enable_prefix_caching,
            )
        )

    # The calls, translated (the kit has checked the request at the spec's door).
    def engine_add(self, request: Request) -> None:
        stops = set(request.stop_token_ids)
        if request.eos_token_id is not None:
            stops.add(request.eos_token_id)  # toyserve folds EOS into its stop tokens
        prompt = list(request.prompt_token_ids)
        seq = ToySequence(request.request_id, prompt, request.max_tokens, frozenset(stops))
        self.engine.submit(seq)

    def engine_schedule(self) -> Mapping[str, int]:
        return self.engine.step()

    def engine_update(self, sampled: Mapping[str, Sequence[int]]) -> dict[str, RequestOutput]:
        tokens = {rid: emitted[-1] for rid, emitted in sampled.items() if emitted}
        finished = {seq.seq_id: seq.finish for seq in self.engine.commit(tokens)}
        return {
            rid: RequestOutput(rid, (token,), FINISH[f] if (f := finished.get(rid)) else None)
            for rid, token in tokens.items()
        }

    def engine_abort(self, request_id: str) -> None:
        self.engine.cancel(request_id)

    # The refinement mapping: what only toyserve knows, in the spec's words.
    def engine_request(self, request_id: str) -> EngineRequest | None:
        seq = self.engine.seqs.get(request_id)
        if seq is None:
            return None  # finished or cancelled
        return EngineRequest(
            output_token_ids=tuple(seq.generated),
            num_computed_tokens=seq.num_computed,
            status=STATUS[seq.state],
            block_ids=tuple(self.engine.blocks.table(request_id)),
            num_preemptions=seq.times_paused,
            prompt_token_ids=tuple(seq.prompt),
        )

    def engine_queues(self) -> tuple[list[str], list[str]]:
        return [s.seq_id for s in self.engine.waiting], [s.seq_id for s in self.engine.running]

    def engine_block_hashes(self, request_id: str) -> Sequence[Hashable]:
        return self.engine.blocks.seq_keys.get(request_id, [])

    def engine_kv(self) -> KVState:
        blocks = self.engine.blocks
        return KVState(
            num_blocks=len(blocks.refs),
            free_block_ids=tuple(blocks.free),
            ref_counts=tuple(blocks.refs),
            block_hashes=tuple(self.hashes.spec_or_none(key) for key in blocks.keys),
            prefix_cache=tuple((self.hashes.spec_of(k), (b,)) for k, b in blocks.cache.items()),
        )
