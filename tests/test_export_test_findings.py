"""docs/FINDINGS.md F2, F3, S1 and S4 each come with a regression test for the engine's
own suite (docs/findings/regression-tests/, written by `schedspec export-test`). For each:
the committed file is what the generator writes from the finding's trace today; run with
pytest in the engine's venv it fails where the bug is; and it passes on a fixed engine,
here the installed one with the fix applied by a conftest.py beside it (no release has
fixed any of the four yet: docs/FINDINGS.md). Each fix is the smallest change that
removes the bug, stated in its conftest.

vLLM's run under this interpreter (the findings stand on 0.33.0 and 0.34.0 alike);
SGLang's under $SCHEDSPEC_SGLANG_VENV's interpreter where it is set, else this one where
SGLang imports (tests/sglang_required.py skips, or in CI fails, otherwise).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from schedspec.export.writers import export_test
from schedspec.traces.trace import Trace
from tests.pytest_run import run_pytest, sglang_python

ROOT = Path(__file__).resolve().parent.parent
FINDINGS = "docs/findings"
TESTS = ROOT / FINDINGS / "regression-tests"

# F2's fix, as the reference makes it (uncache_uncomputed_blocks) and vllm-project/vllm#43569
# proposes: a victim's blocks past its computed tokens were registered in the prefix cache
# by the step that preempts it; take them out of the cache before they are freed.
F2_FIX = """
from vllm.v1.core.sched.scheduler import Scheduler

preempt = Scheduler._preempt_request


def _preempt_request(self, request, *args, **kwargs):
    blocks = self.kv_cache_manager.get_blocks(request.request_id).blocks[0]
    for block in blocks[request.num_computed_tokens // self.block_size :]:
        self.kv_cache_manager.block_pool._maybe_evict_cached_block(block)
    return preempt(self, request, *args, **kwargs)


Scheduler._preempt_request = _preempt_request
"""

# F3's fix, vllm-project/vllm#54028's: no spec-decode padding where the long-prefill cap
# would cut it (one condition more on the padding, in schedule()'s source).
F3_FIX = """
import inspect
import textwrap

from vllm.v1.core.sched import scheduler as module

source = textwrap.dedent(inspect.getsource(module.Scheduler.schedule))
padding = "and num_new_tokens == 1\\n"
assert source.count(padding) == 1
fixed = source.replace(
    padding,
    "and num_new_tokens == 1"
    " and not 0 < long_prefill_token_threshold < 1 + self.num_spec_tokens\\n",
)
namespace = {}
exec(compile(fixed, module.__file__, "exec"), vars(module), namespace)
module.Scheduler.schedule = namespace["schedule"]
"""

# S1's fix: a chunk budget below the page size is raised to one page before the arguments
# are resolved (SGLang's chunks are whole pages; sgl-project/sglang#36417 refuses the
# like of it at start-up instead).
S1_FIX = """
from sglang.srt.server_args import ServerArgs

resolve_once = ServerArgs.resolve_once


def resolve_once_fixed(self):
    if 0 < self.chunked_prefill_size < self.page_size:
        self.chunked_prefill_size = self.page_size
    resolve_once(self)


ServerArgs.resolve_once = resolve_once_fixed
"""

# S4's fix, what the spec's SGLang family does (docs/SPEC.md, "A chunk the pool cannot
# hold"): where the reservations leave no room, the chunked request's next chunk is cut
# to what the pool can give now, and held back when that is nothing, instead of taking a
# whole chunk the pool does not have (PrefillBudget.available_chunk_tokens' fallback).
# Patched once the test module is imported: it installs what SGLang's import needs on CPU.
S4_FIX = """
import pytest


def available_chunk_tokens(self, chunk_limit):
    available = min(chunk_limit, int(self.remaining_total))
    if available > 0:
        return available
    now = min(chunk_limit, int(self.remaining_current))
    return now if now > 0 else None


@pytest.fixture(autouse=True)
def fixed_prefill_budget(monkeypatch):
    from sglang.srt.mem_cache.prefill_budget import PrefillBudget

    monkeypatch.setattr(PrefillBudget, "available_chunk_tokens", available_chunk_tokens)
"""


@dataclass(frozen=True)
class Exported:
    """A finding, its trace and its committed regression test."""

    finding: str
    trace: str  # under docs/findings/
    engine: str
    failure: str  # what pytest prints where the bug is
    fix: str  # a conftest.py that fixes the engine
    engine_args: dict[str, object] = field(default_factory=dict)
    failing_step: int = -1  # which of the file's step() calls fails (-1: the last)

    @property
    def file(self) -> Path:
        return TESTS / ("test_" + self.trace.removesuffix(".json").replace("-", "_") + ".py")

    def generated(self) -> str:
        trace = Trace.load(ROOT / FINDINGS / self.trace)
        name = f"{FINDINGS}/{self.trace}"
        return export_test(
            trace, name, self.engine, f"docs/FINDINGS.md {self.finding}", self.engine_args
        )


EXPORTED = (
    Exported(
        "F2",
        "vllm-priority-victim-keeps-cache-registration.json",
        "vllm",
        "were registered by this step and are free",
        F2_FIX,
    ),
    Exported(
        "F3",
        "vllm-padding-cut-by-long-prefill-cap-crashes.json",
        "vllm",
        "assert num_new_tokens == 1 + self.num_spec_tokens",
        F3_FIX,
    ),
    Exported(
        "S1",
        "sglang-chunk-below-page-size-admits-nothing.json",
        "sglang",
        "nothing runs, and no batch admits ['0#a']",
        S1_FIX,
        {"chunked_prefill_size": 2},
        failing_step=0,  # the first: it would never admit the request
    ),
    Exported(
        "S4",
        "sglang-prefill-out-of-memory-when-aggressive.json",
        "sglang",
        "Prefill out of memory",
        S4_FIX,
    ),
)


@pytest.mark.parametrize("exported", EXPORTED, ids=lambda e: e.finding)
def test_the_committed_file_is_what_the_generator_writes(exported: Exported) -> None:
    assert exported.file.read_text() == exported.generated(), (
        f"{exported.file} is stale: regenerate it with the command its docstring gives"
    )


def engine_python(engine: str) -> str:
    """The interpreter that has the engine (module docstring)."""
    if engine == "vllm":
        pytest.importorskip("vllm", reason="vLLM is not installed: scripts/install_vllm.sh")
        return sys.executable
    return sglang_python("the exported SGLang regression tests")


def run_exported(exported: Exported, tmp_path: Path, fix: str | None) -> tuple[int, str]:
    """pytest on a copy of the committed file (with the fix's conftest.py beside it), in
    the engine's interpreter: its exit status and output."""
    (tmp_path / exported.file.name).write_text(exported.file.read_text())
    if fix is not None:
        (tmp_path / "conftest.py").write_text(fix)
    done = run_pytest(engine_python(exported.engine), tmp_path, exported.file.name)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("exported", EXPORTED, ids=lambda e: e.finding)
def test_the_exported_test_fails_where_the_bug_is(exported: Exported, tmp_path: Path) -> None:
    code, output = run_exported(exported, tmp_path, None)
    assert code == 1, output
    assert exported.failure in output, output
    # At the step where schedspec saw it.
    lines = exported.file.read_text().splitlines()
    steps = [n for n, line in enumerate(lines, 1) if line.startswith("    step(run")]
    assert f"{exported.file.name}:{steps[exported.failing_step]}: " in output, output


@pytest.mark.parametrize("exported", EXPORTED, ids=lambda e: e.finding)
def test_the_exported_test_passes_on_the_fixed_engine(exported: Exported, tmp_path: Path) -> None:
    code, output = run_exported(exported, tmp_path, exported.fix)
    assert code == 0, output
    assert "1 passed" in output, output
