"""odc_pp.megatron: megatron-core GPT chunks for the pipeline runtime (no fork, no patches).

* :func:`odc_pp.megatron.model.build_chunks` -> this rank's :class:`GPTChunk` list (local
  chunk order), initialised from ``(seed, global parameter name)`` so every layout gives
  the same full model; :class:`ModelConfig` describes the model.
* :mod:`odc_pp.megatron.layers`: linears whose weight gradient can be deferred to the
  schedule's W action; :mod:`odc_pp.megatron.spec`: megatron's local layer spec with them.
* :mod:`odc_pp.megatron.compat`: all megatron-core-version-specific code (what each piece
  relies on, what was tested), including the three CUDA assumptions of megatron-core
  0.16 and how they are avoided on CPU.
* :mod:`odc_pp.megatron.hf_config` / :mod:`odc_pp.megatron.hf`: Hugging Face
  ``config.json`` <-> flags and weights in / out (Llama, Qwen2, Qwen3, Mistral).
* :mod:`odc_pp.megatron.recompute`: ``ModelConfig(recompute_lgd=True)`` recomputes
  the norms (LayerNorm / RMSNorm), the activation (GeLU / SwiGLU) and hidden dropout in
  backward; :mod:`odc_pp.planner.memory`
  has the closed form of the bytes it saves (torch-free).
* :mod:`odc_pp.megatron.dropout`: dropout masks hashed from (seed, global sample, token
  offset, layer, site) through the layer spec, so every layout draws the same masks;
  microbatches carry ``global_token_ids`` for it.

Example (one pipeline rank; ``torch.distributed`` initialised, every rank calls it)::

    from odc_pp.megatron import ModelConfig, build_chunks
    from odc_pp.data import Microbatch
    from odc_pp.runtime import PipelineRuntime, RuntimeConfig
    from odc_pp.schedule.build import ScheduleRequest, build
    from odc_pp.training.distributed import standalone_process_groups

    schedule = build(ScheduleRequest.of("zbv", pp=pp, num_microbatches=8))
    chunks = build_chunks(ModelConfig(num_layers=8), pp_rank=rank, pp_size=pp,
                          num_chunks=schedule.num_chunks, placement=schedule.placement,
                          process_groups=standalone_process_groups())
    runtime = PipelineRuntime(RuntimeConfig(), chunks=chunks, pp_group=dist.group.WORLD)
    result = runtime.run_minibatch(schedule, microbatches)  # list[Microbatch], every rank
    optimizer.step(); optimizer.zero_grad()
"""


__all__ = ["GPTChunk", "ModelConfig", "build_chunks", "stage_layers"]


def __getattr__(name):
    # lazy: importing megatron-core takes seconds; odc_pp.megatron's light modules
    # (hf_config, tp_layout) must stay importable without it
    if name in __all__:
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
