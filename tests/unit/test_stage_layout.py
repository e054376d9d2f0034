"""Uneven pipeline stages (--decoder-first/last-pipeline-num-layers): the layer layout
equals megatron-core's own ``get_num_layers_to_build`` / ``get_transformer_layer_offset``."""

import pytest
import torch

from odc_pp.schedule.stage_layout import StageLayout


def _megatron_layers(num_layers, pp, vp, first, last, pp_rank, vp_stage):
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    config = TransformerConfig(num_layers=num_layers, hidden_size=8, num_attention_heads=2,
                               pipeline_model_parallel_size=pp,
                               virtual_pipeline_model_parallel_size=vp,
                               num_layers_in_first_pipeline_stage=first,
                               num_layers_in_last_pipeline_stage=last,
                               pipeline_dtype=torch.float32)
    stage = None if vp is None else vp_stage
    count = get_num_layers_to_build(config, vp_stage=stage, pp_rank=pp_rank)
    try:
        offset = get_transformer_layer_offset(config, vp_stage=stage, pp_rank=pp_rank)
    except ZeroDivisionError:  # megatron-core 0.16.1: vp with no middle stages (pp = 2)
        return count, None
    return count, offset


_GRID = [(num_layers, pp, vp, first, last)
         for num_layers in (4, 6, 8, 12, 16)
         for pp in (2, 3, 4)
         for vp in (None, 2)
         for first in (None, 1, 2, 4)
         for last in (None, 1, 2, 4)
         if first is not None or last is not None]


def _valid(num_layers, pp, vp, first, last):
    try:
        StageLayout.resolve(num_layers, pp, vp or 1, first=first, last=last)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("num_layers,pp,vp,first,last",
                         [case for case in _GRID if _valid(*case)])
def test_layers_equal_megatron_core(num_layers, pp, vp, first, last):
    layout = StageLayout.resolve(num_layers, pp, vp or 1, first=first, last=last)
    for stage in range(layout.num_stages):
        vp_stage, pp_rank = divmod(stage, pp)  # Megatron's virtual stage numbering
        count, offset = _megatron_layers(num_layers, pp, vp, first, last, pp_rank, vp_stage)
        layers = layout.layers(stage)
        assert len(layers) == count, stage
        assert offset is None or layers.start == offset, stage
    assert [layer for s in range(layout.num_stages) for layer in layout.layers(s)] == \
        list(range(num_layers))


def test_grid_covers_uneven_cases():
    valid = [case for case in _GRID if _valid(*case)]
    assert len(valid) > 40
    assert any(vp == 2 and pp == 4 for _, pp, vp, _, _ in valid)


def _middle_left(num_layers, pp, vp, first, last):
    return num_layers >= (first or 0) + (last or 0)


# where the first and last stages take more than --num-layers, megatron-core 0.16.1 builds
# a negative middle (no error); odc-pp refuses it too (test_errors_name_the_flags)
@pytest.mark.parametrize("num_layers,pp,vp,first,last", [
    case for case in _GRID if not _valid(*case) and _middle_left(*case)])
def test_refused_where_megatron_core_refuses(num_layers, pp, vp, first, last):
    from megatron.core.transformer.transformer_config import TransformerConfig

    with pytest.raises((ValueError, AssertionError)):
        config = TransformerConfig(num_layers=num_layers, hidden_size=8, num_attention_heads=2,
                                   pipeline_model_parallel_size=pp,
                                   virtual_pipeline_model_parallel_size=vp,
                                   num_layers_in_first_pipeline_stage=first,
                                   num_layers_in_last_pipeline_stage=last,
                                   pipeline_dtype=torch.float32)
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        for stage in range(pp * (vp or 1)):
            vp_stage, pp_rank = divmod(stage, pp)
            get_num_layers_to_build(config, vp_stage=None if vp is None else vp_stage,
                                    pp_rank=pp_rank)


def test_errors_name_the_flags():
    with pytest.raises(ValueError, match="--decoder-first-pipeline-num-layers 3 must be "
                                         "divisible"):
        StageLayout.resolve(8, 2, 2, first=3, last=5)
    with pytest.raises(ValueError, match="middle layers must divide"):
        StageLayout.resolve(8, 4, 1, first=1, last=2)
    with pytest.raises(ValueError, match="--pipeline-model-parallel-size >= 2"):
        StageLayout.resolve(8, 1, 1, first=1)
    with pytest.raises(ValueError, match="larger than 0"):
        StageLayout.resolve(8, 2, 1, first=0, last=8)
    with pytest.raises(ValueError, match="middle pipeline stages"):
        StageLayout.resolve(8, 2, 1, first=1, last=1)
    with pytest.raises(ValueError, match="-1 middle layers"):
        StageLayout.resolve(4, 3, 1, first=1, last=4)


def test_even_split_unchanged():
    assert StageLayout.even(10, 4).counts() == (3, 3, 2, 2)
    assert StageLayout.resolve(8, 2, 2).relative_sizes() == (1.0,) * 4
    assert StageLayout.resolve(6, 2, 2, first=2, last=4).counts() == (1, 2, 1, 2)


def test_schedules_are_made_for_the_uneven_stage_costs():
    from odc_pp.schedule.costs import CostModel
    from odc_pp.schedule.generators import family
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.components import recompute_costs
    from odc_pp.training.job import Job

    flags = ["--mock-data", "--vocab-size", "64", "--num-layers", "8",
             "--pipeline-model-parallel-size", "4", "--decoder-first-pipeline-num-layers", "1",
             "--decoder-last-pipeline-num-layers", "1"]
    job = Job.resolve(parse_args(flags + ["--pipeline-schedule", "1f1b"]), world=4)
    assert job.stage_layout.counts() == (1, 3, 3, 1)
    # a scalar is scaled by each stage's layers; a per-stage list (--cost-model measured
    # on these stages) is each stage's own already
    costs = recompute_costs(CostModel(t_f=1.0, t_b=2.0, t_w=[1.0, 1.0, 1.0, 2.0]), job.args,
                            4, job.placement)
    assert costs.t_f == [0.5, 1.5, 1.5, 0.5]
    assert costs.t_b == [1.0, 3.0, 3.0, 1.0]
    assert costs.t_w == [1.0, 1.0, 1.0, 2.0]
    zbv = Job.resolve(parse_args(["--mock-data", "--vocab-size", "64", "--num-layers", "12",
                                  "--pipeline-model-parallel-size", "4",
                                  "--decoder-first-pipeline-num-layers", "2",
                                  "--decoder-last-pipeline-num-layers", "2",
                                  "--pipeline-schedule", "zbv"]), world=4)
    counts = zbv.stage_layout.counts()
    assert counts == (1, 2, 2, 1, 1, 2, 2, 1)
    costs = recompute_costs(CostModel(), zbv.args, 4, family("zbv").placement)
    assert costs.t_f == [c / 1.5 for c in counts]
    with pytest.raises(ValueError, match="--decoder-first-pipeline-num-layers 1 must be "
                                         "divisible"):
        Job.resolve(parse_args(flags + ["--pipeline-schedule", "zbv"]), world=4)
