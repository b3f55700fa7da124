"""The spec's fake KV connector as a vLLM connector class, for vLLM's scheduler.

vLLM builds a KV connector by name: KVTransferConfig(kv_connector=CONNECTOR_CLASS,
kv_connector_module_path=CONNECTOR_MODULE) makes its KVConnectorFactory import this
module and instantiate `SchedspecConnector(vllm_config, role, kv_cache_config)`. The
adapter (adapters/vllm/config.py) asks for one when config.kv_connector is set; only
its SCHEDULER role is ever built (there is no worker: the harness writes the worker's
reports into vLLM's ModelRunnerOutput itself, adapters/vllm/engine.py).

Every answer comes from the spec's ConnectorModel (spec/connector.py), which the
reference calls too, so a trace means the same on both: the matched-token query, the
steps a lookup stays unready, delay_free at request_finished. The model names
requests by the spec's ids and blocks by the spec's numbering; this class translates
vLLM's internal request ids (output.external_id) and block ids (vLLM's block 0 is its
null block) on the way in.

Each request's RemoteKV rides on the vLLM request as its kv_transfer_params (what a
client sets through SamplingParams.extra_args["kv_transfer_params"]), under
REMOTE_KV_PARAM, as plain fields: `remote_kv_params` writes them, `remote_kv_of`
reads them back.

Importing this module imports no vLLM (the engine module imports it wherever vLLM
may be missing): the class is built on first access (`connector_class`, and the
module's __getattr__ for vLLM's factory, which reads it by name), through
runtime.load_vllm, the one module that imports vLLM.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from schedspec.adapters.vllm.output import external_id
from schedspec.adapters.vllm.runtime import load_vllm
from schedspec.spec import KVConnectorOutput, RemoteKV
from schedspec.spec.connector import ConnectorModel

CONNECTOR_CLASS = "SchedspecConnector"
CONNECTOR_MODULE = __name__
REMOTE_KV_PARAM = "schedspec_remote_kv"
# The statuses vLLM gives a request that finished by itself (a stop or the length
# cap), as opposed to an abort or an error: only those send their KV on.
_NORMAL_FINISHES = ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")


def remote_kv_params(remote: RemoteKV) -> dict[str, Any]:
    """The kv_transfer_params that carry `remote` to the connector."""
    return {REMOTE_KV_PARAM: dataclasses.asdict(remote)}


def remote_kv_of(request: Any) -> RemoteKV | None:
    """The RemoteKV a vLLM request carries in its kv_transfer_params, or None."""
    params = request.kv_transfer_params
    raw = params.get(REMOTE_KV_PARAM) if params else None
    return None if raw is None else RemoteKV(**raw)


@functools.cache
def connector_class() -> type:
    """SchedspecConnector, a subclass of vLLM's KVConnectorBase_V1 (built once)."""
    v = load_vllm()
    metadata_base: Any = v.KVConnectorMetadata
    connector_base: Any = v.KVConnectorBase_V1

    class SchedspecMetadata(metadata_base):  # type: ignore[misc]
        """What build_connector_meta hands the (absent) worker: nothing."""

    class SchedspecConnector(connector_base):  # type: ignore[misc]
        """vLLM's connector interface answered by the spec's ConnectorModel (the
        scheduler role).

        `model`: the ConnectorModel (its finished_calls is what State.connector shows).
        `delayed`: vLLM's ids of the requests whose request_finished answered
        delay_free (their blocks wait for finished_sending).
        `allocations`: each update_state_after_alloc call as (request, the spec's block
        ids, external tokens): vLLM makes it after every allocation of a request taken
        from a waiting queue.
        """

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
            super().__init__(vllm_config, role, kv_cache_config)
            self.model = ConnectorModel()
            self.delayed: set[str] = set()
            self.allocations: list[tuple[str, tuple[int, ...], int]] = []

        # ------------------------------------------------------ worker side
        # Abstract in vLLM's base class, so they must exist; no worker runs them.

        def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
            return None

        def wait_for_layer_load(self, layer_name: str) -> None:
            return None

        def save_kv_layer(
            self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
        ) -> None:
            return None

        def wait_for_save(self) -> None:
            return None

        # --------------------------------------------------- scheduler side

        def on_new_request(self, request: Any) -> None:
            self.model.on_new_request(external_id(request.request_id))

        def may_load_async(self, request: Any) -> bool:
            """vLLM 0.34.0 (under a cap on loads in flight): whether the request goes
            to async_kv_waiting. The reference's rule: it has remote KV that loads
            async, even where a local hit then leaves nothing to load (a false
            positive, which vLLM's contract allows)."""
            remote = remote_kv_of(request)
            return remote is not None and remote.num_tokens > 0 and remote.load_async

        def get_num_new_matched_tokens(
            self, request: Any, num_computed_tokens: int
        ) -> tuple[int | None, bool]:
            return self.model.get_num_new_matched_tokens(
                external_id(request.request_id),
                remote_kv_of(request),
                request.num_tokens,
                num_computed_tokens,
            )

        def update_state_after_alloc(
            self, request: Any, blocks: Any, num_external_tokens: int
        ) -> None:
            (block_ids,) = blocks.get_block_ids()
            self.allocations.append(
                (
                    external_id(request.request_id),
                    tuple(b - 1 for b in block_ids),
                    num_external_tokens,
                )
            )

        def build_connector_meta(self, scheduler_output: Any) -> Any:
            # vLLM calls it once per schedule(), after its decisions: the model's clock.
            self.model.on_schedule()
            return SchedspecMetadata()

        def update_connector_output(self, connector_output: Any) -> None:
            # vLLM hands the worker's report over before it acts on it: the loads it
            # reports in whole have been served (ConnectorModel).
            self.model.update_connector_output(
                KVConnectorOutput(
                    finished_recving=frozenset(
                        map(external_id, connector_output.finished_recving or ())
                    ),
                    failed_recving=frozenset(
                        map(external_id, getattr(connector_output, "failed_recving", ()) or ())
                    ),
                )
            )

        def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
            delay_free = self.model.request_finished(
                external_id(request.request_id),
                remote_kv_of(request),
                request.status.name in _NORMAL_FINISHES,
                tuple(b - 1 for b in block_ids),
            )
            if delay_free:
                self.delayed.add(request.request_id)
            return delay_free, None

    SchedspecConnector.__name__ = SchedspecConnector.__qualname__ = CONNECTOR_CLASS
    return SchedspecConnector


def __getattr__(name: str) -> Any:
    # vLLM's KVConnectorFactory: getattr(import_module(CONNECTOR_MODULE), CONNECTOR_CLASS).
    if name == CONNECTOR_CLASS:
        return connector_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
