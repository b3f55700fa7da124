"""The abstract model of an iteration-level LLM-serving scheduler.

Depends on nothing else in schedspec; every other part depends on it.
"""

from schedspec.spec.block_hash import BlockHash, extend_block_hashes, hash_block_tokens
from schedspec.spec.config import FAMILIES, Family, SchedulerConfig
from schedspec.spec.connector import (
    ConnectorState,
    HeldBlocks,
    KVConnectorOutput,
    LoadPhase,
    RemoteKV,
)
from schedspec.spec.errors import (
    ConfigError,
    OutputError,
    RequestError,
    SpecInputError,
    named,
    shown,
)
from schedspec.spec.outputs import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    RequestOutput,
    SchedulerOutput,
)
from schedspec.spec.request import (
    PLACEHOLDER_TOKEN_ID,
    Request,
    RequestStatus,
    validate_new_request,
)
from schedspec.spec.state import BatchKind, KVState, RequestState, SGLangState, State

__all__ = [
    "FAMILIES",
    "PLACEHOLDER_TOKEN_ID",
    "BatchKind",
    "BlockHash",
    "CachedRequestData",
    "ConfigError",
    "ConnectorState",
    "Family",
    "HeldBlocks",
    "KVConnectorOutput",
    "KVState",
    "LoadPhase",
    "ModelRunnerOutput",
    "NewRequestData",
    "OutputError",
    "RemoteKV",
    "Request",
    "RequestError",
    "RequestOutput",
    "RequestState",
    "RequestStatus",
    "SGLangState",
    "SchedulerConfig",
    "SchedulerOutput",
    "SpecInputError",
    "State",
    "extend_block_hashes",
    "hash_block_tokens",
    "named",
    "shown",
    "validate_new_request",
]
