"""The execution layer: SchedulerOutput -> flattened batch -> slot mapping and block
tables -> one forward pass of a tiny model with paged attention.

Its checks: output invariance (invariance.py: every request emits what a dense,
one-request-at-a-time run emits) and slot safety on every step (slot_safety.py).
Like the rest of gpu_impl it depends on schedspec.spec only.
"""

from schedspec.gpu_impl.execution.dense_runner import DenseSequence, dense_generate
from schedspec.gpu_impl.execution.drafter import PerturbedDrafter
from schedspec.gpu_impl.execution.errors import ExecutionError
from schedspec.gpu_impl.execution.executed_run import Arrival, ExecutedRun, execute_run
from schedspec.gpu_impl.execution.invariance import (
    InvarianceReport,
    Mismatch,
    check_output_invariance,
    compare_outputs,
    dense_outputs,
)
from schedspec.gpu_impl.execution.model_runner import PagedModelRunner
from schedspec.gpu_impl.execution.slot_checker import SlotSafetyChecker, SlotSafetyError
from schedspec.gpu_impl.execution.stop_rules import StopRule
from schedspec.gpu_impl.execution.tiny_model import TinyModel, TinyModelConfig

__all__ = [
    "Arrival",
    "DenseSequence",
    "ExecutedRun",
    "ExecutionError",
    "InvarianceReport",
    "Mismatch",
    "PagedModelRunner",
    "PerturbedDrafter",
    "SlotSafetyChecker",
    "SlotSafetyError",
    "StopRule",
    "TinyModel",
    "TinyModelConfig",
    "check_output_invariance",
    "compare_outputs",
    "dense_generate",
    "dense_outputs",
    "execute_run",
]
