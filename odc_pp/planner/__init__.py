"""Planning from closed forms, before anything runs: the activation-memory formulas
(:mod:`odc_pp.planner.memory`), the performance model behind ``odc-pp plan`` and its
view with tp and pp fixed, the offload/recompute tuner
(:mod:`odc_pp.planner.offload_tuner`, ``odc-pp tune-offload``: the same search ranks a
schedule, offload and recompute setting per device) (:mod:`odc_pp.planner.inputs`: the
model to plan and length distributions; :mod:`odc_pp.planner.search`: the prediction and
search; :mod:`odc_pp.planner.report`: its table; the command itself, which reads models from HF configs or training flags, is
:mod:`odc_pp.plan_command` at the tools level).

The vocabulary they share: :mod:`odc_pp.planner.model` (the model shape, also training's
throughput/MFU shape) and :mod:`odc_pp.planner.hardware` (the accelerator presets).

Layer: above ``schedule``, ``data``, ``optim`` and ``layout`` (it may import them), on the
same floor as ``runtime`` and ``odc``, which it does not import (nor they it); below
``megatron``, ``training`` and the tools (``tests/unit/test_layering.py``). torch is
imported only where a measurement needs it."""

__all__: list[str] = []
