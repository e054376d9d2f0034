"""odc_pp.runtime: execute a lowered Schedule on model chunks.

Public API: :class:`PipelineRuntime` / :class:`RuntimeConfig` / :class:`MinibatchResult`,
:class:`WeightGradQueue`, :class:`Profiler`, :class:`ActivationStore`; the post-validated
optimizer the runtime validates at POST_VALIDATION lives in
:mod:`odc_pp.optim.post_validation` (re-exported here). The data-parallel contract is in
:mod:`odc_pp.runtime.hooks`; microbatches are :class:`odc_pp.data.Microbatch`.
"""

from odc_pp.optim.post_validation import PostValidatedOptimizer, PostValidationConfig
from odc_pp.optim.step import StepOutcome, SynchronousStep

from .hooks import NoDataParallel, StageDataParallel
from .offload import ActivationStore
from .profiler import Profiler, ProfilerConfig
from .runtime import ActionTiming, MinibatchResult, PipelineRuntime, RuntimeConfig
from .wgrad import WeightGradQueue

__all__ = [
    "NoDataParallel", "StageDataParallel", "ActivationStore",
    "PostValidatedOptimizer", "PostValidationConfig", "StepOutcome", "SynchronousStep",
    "ActionTiming",
    "MinibatchResult", "PipelineRuntime", "RuntimeConfig", "WeightGradQueue", "Profiler",
    "ProfilerConfig",
]
