"""The spec's SchedulerConfig as SGLang's ServerArgs, SGLang's Scheduler built from
them, and the configs the adapter cannot run.

Translation of the config (family "sglang", docs/SPEC.md "Two families"): page_size =
block_size; max_total_tokens = num_blocks * block_size; context_length = max_model_len;
max_running_requests = max_num_seqs; with chunked prefill chunked_prefill_size =
max_num_batched_tokens (max_prefill_tokens left at SGLang's 16384, never the tighter
bound here), without it chunked_prefill_size = -1 and max_prefill_tokens =
max_num_batched_tokens (SGLang then bounds a prefill batch by that); disable_radix_cache
= not enable_prefix_caching; schedule_conservativeness and enable_mixed_chunk as they
are; the overlap scheduler exactly when async_scheduling (disable_overlap_schedule
otherwise); schedule_policy fcfs. `_check_translation` refuses to go on if SGLang's
argument resolution changed any of these.

The rest of ServerArgs is what SGLang's scheduler needs on CPU with the tiny model
(adapters/sglang/runtime.py): device cpu, no tokenizer, dummy weights, no CUDA graphs,
the torch-native attention backend, SGLang's logging at errors, random seed 0.

What is refused (`refusal`, raised by `build_scheduler` as a ConfigError), and the
configs SGLang runs instead:

- a max_model_len above TINY_MAX_POSITIONS, the tiny model's position limit;
- more running requests than SGLang allows the pool: it caps max_running_requests at
  half the pool's tokens (`max_running_requests`) whatever was asked, so the spec's
  max_num_seqs would not be SGLang's. `within_sglangs_caps` lowers max_num_seqs to
  the cap, for configs drawn without SGLang in mind (the default configs:
  schedspec/properties/strategies/engine_configs.py).
"""

from __future__ import annotations

import contextlib
import os
import weakref
from dataclasses import dataclass, replace
from typing import Any

from schedspec.adapters.engine_import import TINY_MAX_POSITIONS
from schedspec.adapters.sglang.runtime import Sglang, skip_the_model
from schedspec.spec import ConfigError, SchedulerConfig
from schedspec.spec.sglang_arithmetic import prefill_budgets, ratio_schedule


def max_running_requests(config: SchedulerConfig) -> int:
    """The most running requests SGLang allows with this pool: it caps
    max_running_requests at half the pool's tokens (KVCacheConfigurator.
    resolve_max_num_reqs), whatever was asked."""
    return config.num_blocks * config.block_size // 2


def refusal(config: SchedulerConfig) -> ConfigError | None:
    """Why the adapter cannot run this config as the spec states it (the field at fault
    and the reason), or None if it can."""
    if config.max_model_len > TINY_MAX_POSITIONS:
        return ConfigError(
            "max_model_len", f"above {TINY_MAX_POSITIONS}, the tiny model's position limit"
        )
    cap = max_running_requests(config)
    if config.max_num_seqs > cap:
        return ConfigError(
            "max_num_seqs",
            f"SGLang caps max_running_requests at half the pool's tokens, {cap} here: "
            f"got {config.max_num_seqs}",
        )
    return None


def within_sglangs_caps(config: SchedulerConfig) -> SchedulerConfig:
    """The config with max_num_seqs lowered to what SGLang allows its pool."""
    return replace(config, max_num_seqs=min(config.max_num_seqs, max_running_requests(config)))


def server_arg_values(config: SchedulerConfig) -> dict[str, Any]:
    """SGLang's ServerArgs for the config, all but model_path, as keyword arguments (the
    module docstring's translation; the exported tests write them out too)."""
    budgets = prefill_budgets(config)
    return {
        "device": "cpu",
        "skip_tokenizer_init": True,
        "load_format": "dummy",
        "disable_cuda_graph": True,
        "attention_backend": "torch_native",
        "log_level": "error",
        "random_seed": 0,
        "page_size": config.block_size,
        "max_total_tokens": config.num_blocks * config.block_size,
        "context_length": config.max_model_len,
        "chunked_prefill_size": budgets.chunked_prefill_size or -1,
        "max_prefill_tokens": budgets.max_prefill_tokens,
        "max_running_requests": config.max_num_seqs,
        "schedule_policy": "fcfs",
        "schedule_conservativeness": config.schedule_conservativeness,
        "enable_mixed_chunk": config.enable_mixed_chunk,
        "disable_radix_cache": not config.enable_prefix_caching,
        "disable_overlap_schedule": not config.async_scheduling,
    }


def server_args(v: Sglang, config: SchedulerConfig) -> Any:
    """SGLang's ServerArgs for the config, with the tiny model."""
    return v.ServerArgs(model_path=v.model_dir, **server_arg_values(config))


@dataclass(frozen=True)
class _Built:
    """A Scheduler and the ZeroMQ ends that outlive it unless closed (`close`)."""

    scheduler: Any
    context: Any  # the ZeroMQ context the Scheduler made its own sockets in
    sockets: tuple[Any, ...]  # the sockets the Scheduler had made in it once built
    # Closes the stand-in socket, the sockets and the context (_close_ends), once: at
    # close() or when the Scheduler is collected, whichever comes first.
    release: weakref.finalize[Any, Any]

    def close(self) -> None:
        """Close the stand-in socket and the Scheduler's sockets and context (if the
        Scheduler's collection has not). Nothing of SGLang's closes them (its scheduler
        process ends instead), and each context left open keeps two I/O threads waking
        to reconnect its sockets to endpoints nobody binds: about 1.5 ms of CPU per
        second per scheduler built, which a run building one per example accumulated."""
        self.release()


def _close_ends(outputs: Any, context: Any, sockets: tuple[Any, ...]) -> None:
    """Close the sockets one by one, then the context. Each socket is held here and
    closed by name, not left to the context's own list: that list holds its sockets
    weakly, and when the garbage collector frees a Scheduler it clears those references
    before any finalizer runs, so a context destroyed then (its own __del__ does so)
    finds no socket to close and waits forever for them to close."""
    outputs.close(0)
    for socket in sockets:
        socket.close(0)
    context.destroy(0)


def build_scheduler(v: Sglang, config: SchedulerConfig) -> _Built:
    """SGLang's Scheduler for the config, built by its own __init__ (runtime.py)."""
    refused = refusal(config)
    if refused is not None:
        raise refused
    built = start_scheduler(v, server_args(v, config))
    _check_translation(built.scheduler, config)
    return built


def start_scheduler(v: Sglang, args: Any) -> _Built:
    """SGLang's Scheduler for its ServerArgs `args`, with the socket that stands in for
    the tokenizer manager (build_scheduler's, for a config; tests give SGLang arguments
    no config expresses)."""
    ports = v.PortArgs.init_new(args)
    # Bound before the scheduler connects (adapters/sglang/runtime.py, 4).
    outputs = v.zmq.Context.instance().socket(v.zmq.PULL)
    outputs.setsockopt(v.zmq.LINGER, 0)
    outputs.bind(ports.tokenizer_ipc_name)
    ranks = v.SpawnRanks(
        world_rank=v.spawn_world_rank(args, tp_rank=0, pp_rank=0), dp_rank=None, gpu_id=0
    )
    v.publish(args, role="scheduler", ranks=ranks)
    scheduler = v.Scheduler(args, ports)
    skip_the_model(v, scheduler)
    channels = scheduler.ipc_channels
    context = channels.send_to_tokenizer.socket.context
    # Outputs dropped where SGLang makes them (adapters/sglang/runtime.py, 4): a sender
    # without a socket is what SGLang gives ranks that stream nothing.
    channels.send_to_tokenizer.socket = None
    channels.send_to_detokenizer.socket = None
    _drop_load_snapshot_writer(scheduler)
    sockets = tuple(context._sockets)
    # Held by the finalizer, the context and its sockets are closed before the garbage
    # collector can free them with the Scheduler (see _close_ends).
    release = weakref.finalize(scheduler, _close_ends, outputs, context, sockets)
    return _Built(scheduler, context, sockets, release)


def _drop_load_snapshot_writer(scheduler: Any) -> None:
    """The load snapshot (this rank's queues and pool use, for SGLang's data-parallel
    controller and tokenizer manager, neither of which runs here) goes nowhere either:
    the scheduler is left without a writer, as SGLang leaves every rank but rank zero.
    With one, each prefill result and every few decodes read the queues and wrote them
    under a file lock, and each Scheduler built left its shared-memory file
    (/dev/shm/sglang_loads_*) behind; the writer is closed and its file removed."""
    writer = scheduler.load_snapshot_writer
    scheduler.load_snapshot_writer = None
    if writer is None:
        return
    writer.close()
    path = getattr(writer, "path", None)  # the shared-memory writer's; not a ZeroMQ one's
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _check_translation(scheduler: Any, config: SchedulerConfig) -> None:
    """SGLang's argument resolution may rewrite a value; refuse to test anything but ours."""
    budgets = prefill_budgets(config)
    seen = {
        "page_size": scheduler.page_size,
        "max_total_num_tokens": scheduler.max_total_num_tokens,
        "available_tokens": scheduler.token_to_kv_pool_allocator.available_size(),
        "context_len": scheduler.model_config.context_len,
        "chunked_prefill_size": scheduler.chunked_prefill_size,
        "max_prefill_tokens": scheduler.max_prefill_tokens,
        "max_running_requests": scheduler.max_running_requests,
        "radix_cache": not scheduler.tree_cache.disable,
        "mixed_chunk": scheduler.is_mixed_chunk,
        "overlap": scheduler.enable_overlap,
        "initial_new_token_ratio": scheduler.new_token_ratio_tracker.init,
    }
    wanted = {
        "page_size": config.block_size,
        "max_total_num_tokens": config.num_blocks * config.block_size,
        "available_tokens": config.num_blocks * config.block_size,
        "context_len": config.max_model_len,
        "chunked_prefill_size": budgets.chunked_prefill_size,
        "max_prefill_tokens": budgets.max_prefill_tokens,
        "max_running_requests": config.max_num_seqs,
        "radix_cache": config.enable_prefix_caching,
        "mixed_chunk": config.enable_mixed_chunk,
        "overlap": config.async_scheduling,
        "initial_new_token_ratio": ratio_schedule(config.schedule_conservativeness).init,
    }
    differ = {name: (wanted[name], got) for name, got in seen.items() if got != wanted[name]}
    if differ:
        raise RuntimeError(f"SGLang did not take the config as given (wanted, got): {differ}")
