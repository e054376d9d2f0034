"""``odc-pp plan``: the planner and performance model. It sits at the tools level (it
reads training flags and prints ``pretrain_gpt.py`` flags) and reuses the project's one
owner of each concept: the schedule simulator (:mod:`odc_pp.schedule.simulator`), the
minibatch planner (:func:`odc_pp.data.plan_minibatch`), the FLOPs formula
(:func:`odc_pp.schedule.costs.transformer_layer_flops`), tensor-parallel communication
(:mod:`odc_pp.schedule.costs`) and the activation/model-state memory of
``odc-pp tune-offload`` (:func:`odc_pp.schedule.offload_tuner.layer_activation_bytes`).
See docs/planner.md."""

from .inputs import CLUSTERS, Cluster, ModelSpec, load_lengths, model_from_flags, model_from_hf
from .search import PlanConfig, Prediction, pipeline_time, plan, predict

__all__ = ["CLUSTERS", "Cluster", "ModelSpec", "PlanConfig", "Prediction", "load_lengths",
           "model_from_flags", "model_from_hf", "pipeline_time", "plan", "predict"]
