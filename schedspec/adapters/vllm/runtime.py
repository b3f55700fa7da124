"""vLLM imported into this process: once, offline and quiet, with its tiny model folders
written (adapters/engine_import.py says what every engine's import shares).

vLLM is imported only here, and only when an engine is built; install it with
`schedspec install vllm`. The names the adapter uses are `Vllm`'s fields, all
Any: vLLM ships no type stubs.

The tiny models (no tokenizer, no weights, HF_HUB_OFFLINE=1): a Llama `config.json`
that the ModelConfig points at, and a one-layer EAGLE drafter's, which an EAGLE
SpeculativeConfig points at (adapters/vllm/config.py). Their max_position_embeddings
(engine_import.TINY_MAX_POSITIONS) is the largest max_model_len the adapter can ask for.

Quiet: only errors from QUIETED_LOGGERS, unless the user configured vLLM's logging (a
VLLM_LOGGING_VARIABLES variable set) or gave such a logger a level. vLLM's own logger
warns about every tiny config (block sizes, budgets); torch's custom-op registry warns
"Triton not available" whenever vLLM imports its Triton kernels on a machine without
Triton (an engine build that misses vLLM's model-info cache does, to write the cache).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schedspec.adapters import engine_import
from schedspec.install import install_command

INSTALL_STEP = install_command("vllm")
_LLAMA = engine_import.tiny_llama("LlamaForCausalLM")
_EAGLE = engine_import.tiny_llama("EagleLlamaForCausalLM", num_hidden_layers=1)
QUIETED_LOGGERS = ("vllm", "torch._library.triton")
# Any of these set means the user configured vLLM's logging and wants to see it.
VLLM_LOGGING_VARIABLES = (
    "VLLM_LOGGING_LEVEL",
    "VLLM_LOGGING_CONFIG_PATH",
    "VLLM_CONFIGURE_LOGGING",
)


class VllmMissingError(engine_import.EngineMissingError):
    """vLLM is not importable in this environment."""


@dataclass(frozen=True)
class Vllm:
    """The vLLM names the adapter uses (all Any: vLLM ships no type stubs)."""

    CacheConfig: Any
    DeviceConfig: Any
    ModelConfig: Any
    ParallelConfig: Any
    SchedulerConfig: Any
    SpeculativeConfig: Any
    VllmConfig: Any
    Scheduler: Any
    FullAttentionSpec: Any
    SlidingWindowSpec: Any
    ChunkedLocalAttentionSpec: Any
    MambaSpec: Any
    KVCacheConfig: Any
    KVCacheGroupSpec: Any
    StructuredOutputManager: Any
    register_all_kvcache_specs: Any
    resolve_kv_cache_block_sizes: Any
    get_request_block_hasher: Any
    init_none_hash: Any
    get_hash_fn_by_name: Any
    Request: Any
    RequestStatus: Any
    SamplingParams: Any
    ModelRunnerOutput: Any
    DraftTokenIds: Any
    # The KV connector's parts (adapters/vllm/connector.py).
    KVTransferConfig: Any
    KVConnectorBase_V1: Any
    KVConnectorMetadata: Any
    KVConnectorOutput: Any
    float32: Any
    model_dir: str
    eagle_dir: str
    # Whether ModelRunnerOutput takes req_id_to_index (0.33.0; 0.34.0 dropped it).
    runner_output_indexed: bool


def _import_vllm() -> Vllm:
    """Import vLLM, quiet, and write the tiny model folders."""
    quiet_vllm_logging()
    with engine_import.importing("vLLM", f"into this venv with `{INSTALL_STEP}`", VllmMissingError):
        import torch
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            KVTransferConfig,
            ModelConfig,
            ParallelConfig,
            SpeculativeConfig,
            VllmConfig,
        )
        from vllm.config import SchedulerConfig as VllmSchedulerConfig
        from vllm.distributed.kv_transfer.kv_connector.v1.base import (
            KVConnectorBase_V1,
            KVConnectorMetadata,
        )
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import (
            get_request_block_hasher,
            init_none_hash,
            resolve_kv_cache_block_sizes,
        )
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
        from vllm.v1.kv_cache_interface import (
            ChunkedLocalAttentionSpec,
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            MambaSpec,
            SlidingWindowSpec,
        )
        from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput
        from vllm.v1.outputs import ModelRunnerOutput as VllmModelRunnerOutput
        from vllm.v1.request import Request as VllmRequest
        from vllm.v1.request import RequestStatus as VllmRequestStatus
        from vllm.v1.structured_output import StructuredOutputManager
    folders = engine_import.tiny_model_folders(
        "schedspec-vllm-", {"model": _LLAMA, "eagle": _EAGLE}
    )
    return Vllm(
        CacheConfig=CacheConfig,
        DeviceConfig=DeviceConfig,
        ModelConfig=ModelConfig,
        ParallelConfig=ParallelConfig,
        SchedulerConfig=VllmSchedulerConfig,
        SpeculativeConfig=SpeculativeConfig,
        VllmConfig=VllmConfig,
        Scheduler=Scheduler,
        FullAttentionSpec=FullAttentionSpec,
        SlidingWindowSpec=SlidingWindowSpec,
        ChunkedLocalAttentionSpec=ChunkedLocalAttentionSpec,
        MambaSpec=MambaSpec,
        KVCacheConfig=KVCacheConfig,
        KVCacheGroupSpec=KVCacheGroupSpec,
        StructuredOutputManager=StructuredOutputManager,
        register_all_kvcache_specs=register_all_kvcache_specs,
        resolve_kv_cache_block_sizes=resolve_kv_cache_block_sizes,
        get_request_block_hasher=get_request_block_hasher,
        init_none_hash=init_none_hash,
        get_hash_fn_by_name=get_hash_fn_by_name,
        Request=VllmRequest,
        RequestStatus=VllmRequestStatus,
        SamplingParams=SamplingParams,
        ModelRunnerOutput=VllmModelRunnerOutput,
        DraftTokenIds=DraftTokenIds,
        KVTransferConfig=KVTransferConfig,
        KVConnectorBase_V1=KVConnectorBase_V1,
        KVConnectorMetadata=KVConnectorMetadata,
        KVConnectorOutput=KVConnectorOutput,
        float32=torch.float32,
        model_dir=folders["model"],
        eagle_dir=folders["eagle"],
        runner_output_indexed="req_id_to_index"
        in {f.name for f in dataclasses.fields(VllmModelRunnerOutput)},
    )


VLLM = engine_import.ImportedOnce(_import_vllm)


def load_vllm() -> Vllm:
    """Import vLLM once, offline and quiet, with the tiny model folders written."""
    return VLLM.get()


def vllm_runner_output(
    v: Vllm, req_ids: list[str], sampled: Sequence[list[int]], kv_connector_output: Any = None
) -> Any:
    """vLLM's ModelRunnerOutput for one step: `sampled[i]` is what request `req_ids[i]`
    sampled; kv_connector_output, the connector's worker report (a vLLM
    KVConnectorOutput) or None. 0.33.0's Scheduler.update_from_output finds a request's
    row through req_id_to_index; 0.34.0's through the order of req_ids, and has no such
    field."""
    index = {"req_id_to_index": {rid: i for i, rid in enumerate(req_ids)}}
    return v.ModelRunnerOutput(
        req_ids=req_ids,
        sampled_token_ids=list(sampled),
        kv_connector_output=kv_connector_output,
        **(index if v.runner_output_indexed else {}),
    )


def vllm_available() -> bool:
    """Whether vLLM can be imported (and so a VllmEngine built)."""
    return VLLM.available()


def quiet_vllm_logging() -> None:
    """Keep only errors from QUIETED_LOGGERS, unless the user configured vLLM's logging
    (a VLLM_LOGGING_VARIABLES variable set) or already gave that logger a level."""
    engine_import.quiet_loggers(QUIETED_LOGGERS, logging.ERROR, VLLM_LOGGING_VARIABLES)
