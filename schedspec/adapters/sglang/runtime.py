"""SGLang's real Scheduler, built in this process on CPU: the couplings to a GPU build undone.

SGLang is imported only here, once, offline and quiet (adapters/engine_import.py says
what every engine's import shares), and only when an engine is built; install it with
`schedspec install sglang VENV` (a venv of its own: its pins exclude vLLM's). What
is real: `sglang.srt.managers.scheduler.Scheduler`, built by its own __init__ from
ServerArgs, with its TpModelWorker, ModelRunner, Sampler, token and request pools, radix
cache, SchedulePolicy and PrefillAdder. What stands in, and why (nothing of SGLang is
edited; each is an extension point SGLang offers or a module attribute replaced):

1. The model. SGLang's real layers import CUDA kernels on a non-CUDA device, and its
   CPU engine needs an sgl-kernel CPU build PyPI does not ship. The tiny config names
   the architecture HarnessModel, registered through SGLang's ModelRegistry (its hook
   for external models): it writes no KV and returns all-zero logits. The token each
   request samples is the harness's (FakeModel); the adapter puts it into the batch
   result before SGLang processes it, so nothing depends on what the sampler picked.
2. torchvision. `sglang.srt.configs` imports torchvision.transforms at import time (for
   multimodal configs); PyPI's wheels need a CUDA torch. Where torchvision does not
   import, a meta-path finder answers `import torchvision...` with empty modules whose
   every attribute refuses to be used; it is installed after transformers has cached
   "torchvision is not available", so transformers never reaches for it.
3. One parallel runtime per process. `bootstrap.init_parallel_runtime` refuses to run
   twice; every Scheduler built here is one CPU rank with tensor parallelism 1, so the
   process groups the first build made serve every later one, and later calls return.
4. Outputs. The scheduler PUSHes what it streams to the tokenizer manager over ZeroMQ;
   a PULL socket is bound to that endpoint before the scheduler connects (a PUSH that
   connects first retries every 100 ms), and once built the scheduler's senders lose
   their sockets, as on a rank that streams nothing: the adapter reads each request's
   outcome from SGLang's Req objects, and pickling, sending and draining each step's
   outputs only to drop them took a few percent of a checked step. Both ends are
   closed when the engine is let go of (config._Built.close).
5. The memory probe's full garbage collection. Before it reads the free memory to size
   the KV pool, SGLang's KV-cache configurator runs `gc.collect()` (weights' temporaries
   on a GPU). Here the pool's size is given (max_total_tokens) and the model is one
   parameter, so it frees nothing the probe could see; but in a process holding
   Hypothesis's and torch's objects it took about 80 % of each build (0.38 of 0.44 CPU
   seconds). The configurator's `gc` is a stand-in whose `collect` is the youngest
   generation's; `_check_translation` (config.py) still refuses a pool that came out
   another size.
6. torch's intra-op threads: one. Each step the harness model builds a (batch, vocab)
   logits tensor and SGLang's sampler takes its argmax; on tensors this small a pool of
   threads only adds its hand-offs, which on a loaded 2-core machine made those two calls
   about 15 times slower than on one thread (3.5 ms against 0.2 ms a step), the larger
   part of a checked step. The count is set once, when SGLang is imported, for the
   process (`schedspec run` does the same for its tiny model).
7. The forward. Each launched batch went through SGLang's model worker: a ForwardBatch
   built from it, the model runner and the harness model's zero logits, the sampler's
   argmax, about a fifth of a checked step for a result whose every token is 0 and is
   overwritten with the harness's tokens before SGLang reads it (1). The worker's
   forward_batch_generation is replaced on each Scheduler built (`skip_the_model`) by
   one that returns that result without the model: a GenerationBatchResult with one
   token 0 per request, as the argmax gave. The scheduler's own side of run_batch (its
   counters, the overlap loop's future map and result copy, the radix cache's update)
   runs as before; SGLang's forward keeps the ScheduleBatch as it found it (run_batch
   restores it under the overlap loop), so what the scheduler decides next is what it
   decided with the model.
8. The watchdog. Each Scheduler starts a watchdog thread (two with SGLang's soft
   watchdog, which CI turns on) that polls its forward counter to kill a hung server
   process. It never ends, and its closures hold the Scheduler, so every Scheduler
   built here stayed alive with its pools and a sleeping thread: a run of 100
   examples ended with 100 such threads, and the heap every full collection walks grew
   by one Scheduler per example. The adapter never runs SGLang's event loop (the
   harness's own step limit watches its calls: engines/watchdog.py), so the
   scheduler module's `create_scheduler_watchdog` is replaced by one that returns
   SGLang's own no-op watchdog (`Watchdog.create` with no timeout); the Scheduler
   keeps it as `watchdog` and never calls it.
"""

from __future__ import annotations

import gc
import importlib.abc
import importlib.machinery
import logging
import sys
import types
import warnings
from dataclasses import dataclass
from typing import Any

from schedspec.adapters import engine_import
from schedspec.install import install_command

INSTALL_STEP = f"{install_command('sglang')} VENV"
TINY_MODEL_ARCHITECTURE = "HarnessModel"
TINY_MODEL = engine_import.tiny_llama(
    TINY_MODEL_ARCHITECTURE,
    rms_norm_eps=1e-6,
    # No model EOS: a request's EOS is its own (the spec's eos_token_id), never the
    # model's, so SGLang stops a request only on the stop tokens the harness gave it.
    # Stated as null: left out, transformers' LlamaConfig defaults it to 2 (and BOS to
    # 1), and SGLang would stop every request that samples token 2.
    eos_token_id=None,
    bos_token_id=None,
)


class SglangMissingError(engine_import.EngineMissingError):
    """SGLang is not importable in this environment."""


# ------------------------------------------------------------------ torchvision


class _Unusable:
    """Any attribute of the stubbed torchvision: refuses to be built or called."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("torchvision is stubbed for SGLang's scheduler on CPU")


def _stub_attribute(name: str) -> type[_Unusable]:
    """A stubbed torchvision module's attribute: _Unusable, except the dunder names
    Python and tools look up on every module (__file__, __spec__...), which it lacks,
    as a module without them does."""
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    return _Unusable


class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers `import torchvision[.anything]` with an empty package."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _stub_attribute  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _stub_torchvision_if_broken() -> None:
    """Install the stub unless a working torchvision imports (then SGLang uses it)."""
    if any(isinstance(finder, _TorchvisionStub) for finder in sys.meta_path):
        return
    try:
        import torchvision  # noqa: F401

        return
    except Exception:
        sys.modules.pop("torchvision", None)
    import transformers.utils.import_utils as import_utils

    # Cached (lru_cache) before the stub exists, so transformers keeps saying "absent".
    import_utils.is_torchvision_available()
    sys.meta_path.insert(0, _TorchvisionStub())


# ------------------------------------------------------------------ SGLang names


@dataclass(frozen=True)
class Sglang:
    """The SGLang names the adapter uses (all Any: SGLang ships no type stubs)."""

    Scheduler: Any
    ServerArgs: Any
    PortArgs: Any
    TokenizedGenerateReqInput: Any
    SamplingParams: Any
    AbortReq: Any
    FINISH_ABORT: Any
    FINISH_LENGTH: Any
    FINISH_MATCHED_TOKEN: Any
    ForwardMode: Any
    GenerationBatchResult: Any
    LogitsProcessorOutput: Any
    publish: Any
    SpawnRanks: Any
    spawn_world_rank: Any
    torch: Any
    zmq: Any
    model_dir: str


def _import_sglang() -> Sglang:
    """Import SGLang, quiet, and register and write the tiny model."""
    quiet_sglang_logging()
    with engine_import.importing(
        "SGLang", f"into a venv of its own with `{INSTALL_STEP}`", SglangMissingError
    ):
        _stub_torchvision_if_broken()
        import torch
        import zmq
        from sglang.srt.distributed import bootstrap
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
        from sglang.srt.managers.schedule_batch import (
            FINISH_ABORT,
            FINISH_LENGTH,
            FINISH_MATCHED_TOKEN,
        )
        from sglang.srt.managers.scheduler import GenerationBatchResult, Scheduler
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.models.registry import ModelRegistry
        from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import PortArgs, ServerArgs
    _run_parallel_runtime_once(bootstrap)
    _young_collection_in_memory_probe()
    _no_scheduler_watchdog()
    torch.set_num_threads(1)
    ModelRegistry._load_default_models()
    ModelRegistry.models[TINY_MODEL_ARCHITECTURE] = _harness_model_class(torch)
    folders = engine_import.tiny_model_folders("schedspec-sglang-", {"model": TINY_MODEL})
    return Sglang(
        Scheduler=Scheduler,
        ServerArgs=ServerArgs,
        PortArgs=PortArgs,
        TokenizedGenerateReqInput=TokenizedGenerateReqInput,
        SamplingParams=SamplingParams,
        AbortReq=AbortReq,
        FINISH_ABORT=FINISH_ABORT,
        FINISH_LENGTH=FINISH_LENGTH,
        FINISH_MATCHED_TOKEN=FINISH_MATCHED_TOKEN,
        ForwardMode=ForwardMode,
        GenerationBatchResult=GenerationBatchResult,
        LogitsProcessorOutput=LogitsProcessorOutput,
        publish=publish,
        SpawnRanks=SpawnRanks,
        spawn_world_rank=spawn_world_rank,
        torch=torch,
        zmq=zmq,
        model_dir=folders["model"],
    )


SGLANG = engine_import.ImportedOnce(_import_sglang)


def load_sglang() -> Sglang:
    """Import SGLang once, offline and quiet, with the tiny model registered."""
    return SGLANG.get()


def _harness_model_class(torch: Any) -> type:
    """The model class SGLang builds for the tiny config: no KV, zero logits."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    class HarnessModel(torch.nn.Module):  # type: ignore[misc]
        def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
            super().__init__()
            self.config = config
            # One parameter, so that SGLang's loader and memory accounting have a model.
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def load_weights(self, weights: Any) -> None:
            for _ in weights:
                pass

        @torch.no_grad()  # type: ignore[untyped-decorator]
        def forward(
            self, input_ids: Any, positions: Any, forward_batch: Any, *args: Any, **kwargs: Any
        ) -> Any:
            logits = torch.zeros((forward_batch.batch_size, self.config.vocab_size))
            return LogitsProcessorOutput(next_token_logits=logits)

    HarnessModel.__name__ = HarnessModel.__qualname__ = TINY_MODEL_ARCHITECTURE
    return HarnessModel


def skip_the_model(v: Sglang, scheduler: Any) -> None:
    """Give the Scheduler's model worker the forward that skips the model (the module
    docstring, 7)."""
    if scheduler.model_worker is not scheduler.tp_worker:
        raise RuntimeError("SGLang built a draft worker: the adapter schedules no drafts")
    torch = v.torch

    def forward_batch_generation(batch: Any, pp_proxy_tensors: Any = None) -> Any:
        if batch is None or pp_proxy_tensors is not None:
            raise RuntimeError("SGLang ran a forward the adapter does not stand in for")
        return v.GenerationBatchResult(
            logits_output=v.LogitsProcessorOutput(next_token_logits=None),
            next_token_ids=torch.zeros(len(batch.reqs), dtype=torch.int64),
            can_run_cuda_graph=False,
        )

    scheduler.tp_worker.forward_batch_generation = forward_batch_generation


def _run_parallel_runtime_once(bootstrap: Any) -> None:
    """Make bootstrap.init_parallel_runtime return after its first call (see the module
    docstring, 3)."""
    original = bootstrap.init_parallel_runtime
    if getattr(original, "_schedspec_once", False):
        return
    done: list[bool] = []

    def init_parallel_runtime_once(**kwargs: Any) -> None:
        if not done:
            original(**kwargs)
            done.append(True)

    init_parallel_runtime_once._schedspec_once = True  # type: ignore[attr-defined]
    bootstrap.init_parallel_runtime = init_parallel_runtime_once


class _YoungCollection(types.ModuleType):
    """The `gc` the KV-cache configurator sees (the module docstring, 5): every other
    attribute is the real module's."""

    def __init__(self) -> None:
        super().__init__("gc")

    def __getattr__(self, name: str) -> Any:
        return getattr(gc, name)

    @staticmethod
    def collect(generation: int = 0) -> int:
        return gc.collect(0)


def _young_collection_in_memory_probe() -> None:
    """Give SGLang's KV-cache configurator the young-generation `gc` (idempotent)."""
    from sglang.srt.mem_cache import kv_cache_configurator

    if not isinstance(kv_cache_configurator.gc, _YoungCollection):
        kv_cache_configurator.gc = _YoungCollection()


def _no_scheduler_watchdog() -> None:
    """Give SGLang's scheduler module a watchdog factory that starts no thread (the
    module docstring, 8; idempotent)."""
    from sglang.srt.managers import scheduler
    from sglang.srt.utils.watchdog import Watchdog

    def create_no_watchdog(owner: Any, watchdog_timeout: float, soft: bool = False) -> Any:
        return Watchdog.create(debug_name="Scheduler", watchdog_timeout=None)

    scheduler.create_scheduler_watchdog = create_no_watchdog


# SGLang's loggers warn about every tiny config (a pool smaller than the context
# length), log every retraction, and log each prompt its door refuses as an error
# (the adapter raises that refusal as RequestError with SGLang's message, which the
# harness judges); configure_logging would otherwise reset them.
QUIETED_LOGGERS = ("sglang",)
SGLANG_LOGGING_VARIABLES = ("SGLANG_LOGGING_CONFIG_PATH", "SGLANG_LOG_LEVEL")


def quiet_sglang_logging() -> None:
    """Keep only critical records from SGLang's loggers, and drop the warnings its modules
    give at import time about CUDA-only kernels this CPU path never runs (AWQ, GGUF,
    Triton), unless the user configured SGLang's logging (a SGLANG_LOGGING_VARIABLES
    variable set) or gave the logger a level."""
    if engine_import.quiet_loggers(QUIETED_LOGGERS, logging.CRITICAL, SGLANG_LOGGING_VARIABLES):
        warnings.filterwarnings("ignore", category=UserWarning, module=r"sglang\.")


def sglang_available() -> bool:
    """Whether SGLang can be imported (and so an SGLang engine built)."""
    return SGLANG.available()
