"""odc_pp.runtime: execute a lowered Schedule on model chunks.

Public API: :class:`PipelineRuntime` / :class:`RuntimeConfig` / :class:`MinibatchResult`,
:class:`WeightGradQueue`, :class:`PostValidatedOptimizer`,
:class:`Profiler`, :class:`ActivationStore`. The data-parallel contract is in
:mod:`odc_pp.runtime.hooks`; microbatches are :class:`odc_pp.data.Microbatch`.
"""

from .hooks import NoDataParallel, StageDataParallel
from .offload import ActivationStore
from .profiler import Profiler, ProfilerConfig
from .post_validation import PostValidatedOptimizer, PostValidationConfig, StepOutcome
from .runtime import ActionTiming, MinibatchResult, PipelineRuntime, RuntimeConfig
from .wgrad import WeightGradQueue

__all__ = [
    "NoDataParallel", "StageDataParallel", "ActivationStore",
    "PostValidatedOptimizer", "PostValidationConfig", "StepOutcome", "ActionTiming",
    "MinibatchResult", "PipelineRuntime", "RuntimeConfig", "WeightGradQueue", "Profiler",
    "ProfilerConfig",
]
