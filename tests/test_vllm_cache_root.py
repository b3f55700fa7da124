"""The suite runs vLLM with a fresh VLLM_CACHE_ROOT of its own (tests/conftest.py), so no
per-user cache can hide a dependency missing from the venv (einops once hid so)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tests.conftest import SESSION_VLLM_CACHE_ROOT, VLLM_CACHE_PREFIX, use_fresh_vllm_cache
from tests.vllm_required import require_vllm


def test_use_fresh_vllm_cache_replaces_a_warm_cache_with_a_new_empty_folder(
    tmp_path: Path,
) -> None:
    warm = tmp_path / "warm"
    (warm / "modelinfos").mkdir(parents=True)
    environ = {"VLLM_CACHE_ROOT": str(warm)}
    first = use_fresh_vllm_cache(environ)
    second = use_fresh_vllm_cache(environ)
    try:
        assert environ == {"VLLM_CACHE_ROOT": second}
        assert len({str(warm), first, second}) == 3
        for root in (first, second):
            assert Path(root).parent == Path(tempfile.gettempdir())
            assert Path(root).name.startswith(VLLM_CACHE_PREFIX)
            assert list(Path(root).iterdir()) == []
    finally:
        os.rmdir(first)
        os.rmdir(second)


def test_the_session_uses_its_own_cache_root() -> None:
    assert os.environ["VLLM_CACHE_ROOT"] == SESSION_VLLM_CACHE_ROOT
    assert Path(SESSION_VLLM_CACHE_ROOT).name.startswith(VLLM_CACHE_PREFIX)
    assert Path(SESSION_VLLM_CACHE_ROOT).is_dir()
    assert Path(SESSION_VLLM_CACHE_ROOT) != Path("~/.cache/vllm").expanduser()


def test_vllm_writes_its_model_inspection_to_the_sessions_cache_root() -> None:
    require_vllm("the cache-root test")
    from vllm import envs

    from schedspec.adapters.vllm.engine import VllmEngine
    from schedspec.spec import SchedulerConfig

    assert envs.VLLM_CACHE_ROOT == SESSION_VLLM_CACHE_ROOT
    VllmEngine(
        SchedulerConfig(
            block_size=4, num_blocks=8, max_num_batched_tokens=16, max_num_seqs=2, max_model_len=32
        )
    )
    inspected = sorted(p.name for p in (Path(SESSION_VLLM_CACHE_ROOT) / "modelinfos").iterdir())
    assert any("LlamaForCausalLM" in name for name in inspected), inspected
