"""A planted gpu_impl bug for swarm runs in processes of their own (a Ray worker starts
fresh, so a monkeypatch in the test process never reaches it): importing this module makes
preemption forget to free the victim's block table, the bug tests/test_gpu_swarm.py plants
with monkeypatch. A run loads it by naming its configs, `--configs
tests.swarm_planted:tight_configs`, in the driver and in every worker (each loads the
configs by name). Never import it into the test process: gpu_impl would stay broken for
every test after it.
"""

from __future__ import annotations

from hypothesis import strategies as st

import schedspec.gpu_impl.step_plan as step_plan
from schedspec.spec import SchedulerConfig
from tests.test_gpu_swarm import TIGHT

setattr(step_plan, "release_tables", lambda *args: None)  # noqa: B010 (as monkeypatch sets it)


def tight_configs() -> st.SearchStrategy[SchedulerConfig]:
    return st.just(TIGHT)
