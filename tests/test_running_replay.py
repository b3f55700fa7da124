"""The replay of vLLM's running loop under priority (running_replay.py): which victims the
step served before it preempted them, a decision the output does not show."""

from __future__ import annotations

import dataclasses

from schedspec.spec.invariants.vllm.running_replay import (
    replay_priority_running,
    served_priority_victims,
)
from tests.invariant_builders import Driver, served_victim_with_a_decode_in_flight


def test_a_victim_ahead_of_the_request_it_makes_room_for_was_served() -> None:
    # V precedes A in the running list and its block fitted; A's did not.
    t = served_victim_with_a_decode_in_flight()
    phase = replay_priority_running(t.pre)
    assert phase.scheduled == {"A": 1}
    assert phase.preempted == ("V",)
    assert phase.served_victims == {"V"}
    assert served_priority_victims(t) == {"V"}


def test_a_victim_behind_its_preempter_was_not_served() -> None:
    # Priority, 2 blocks of 4: A (priority 0) and V (priority 1) hold one each; A's
    # position 4 needs a block, so V, behind A, is preempted before the loop reaches it.
    driver = Driver(policy="priority", num_blocks=2, max_model_len=8, max_num_seqs=4)
    driver.add("A", 4, priority=0)
    driver.add("V", 3, priority=1)
    driver.step()  # A: block 0 full; V: one block
    t = driver.schedule()  # A's position 4 needs a second block: none is free
    assert t.output.preempted_req_ids == {"V"}
    phase = replay_priority_running(t.pre)
    assert phase.preempted == ("V",)
    assert phase.served_victims == frozenset()
    assert served_priority_victims(t) == frozenset()


def test_a_step_the_replay_does_not_reproduce_names_no_victim() -> None:
    # The same state, but an output that scheduled A for one token less than the loop
    # gives it: the replay is not trusted (GREEDY-BUDGET reports the step).
    t = served_victim_with_a_decode_in_flight()
    output = dataclasses.replace(t.output, num_scheduled_tokens={"A": 0})
    assert served_priority_victims(dataclasses.replace(t, output=output)) == frozenset()


def test_fcfs_serves_no_victim_first() -> None:
    driver = Driver(num_blocks=2, max_model_len=8, max_num_seqs=4)
    driver.add("A", 4)
    driver.add("V", 3)
    driver.step()
    t = driver.schedule()
    assert t.output.preempted_req_ids == {"V"}
    assert served_priority_victims(t) == frozenset()
