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


# Megatron-LM's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split
def _megatron_config(num_layers, pp, vp, embedding, loss):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=num_layers, hidden_size=8, num_attention_heads=2,
                             pipeline_model_parallel_size=pp,
                             virtual_pipeline_model_parallel_size=vp,
                             account_for_embedding_in_pipeline_split=embedding,
                             account_for_loss_in_pipeline_split=loss,
                             pipeline_dtype=torch.float32)


def _megatron_accounted(config, pp_rank, vp_stage):
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    return (get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank),
            get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=pp_rank))


# the papers' layouts among them: PipeOffload's 38 layers at pp 8 x 5 chunks, 46 at
# pp 16 x 3, 62 at pp 32; zero-bubble's 22 / 30 at pp 8, 46 at pp 16, 62 at pp 32 with
# one layer a chunk
_ACCOUNTED = [(num_layers, pp, vp, embedding, loss)
              for num_layers in (2, 3, 4, 5, 6, 7, 8, 10, 14, 22, 30, 38)
              for pp in (2, 3, 4, 8)
              for vp in (None, 2, 3, 4, 5)
              for embedding in (False, True)
              for loss in (False, True)
              if embedding or loss] + [(46, 16, 3, True, True), (62, 32, None, True, True),
                                       (46, 16, None, True, True), (62, 32, 2, True, True)]


def _accounted_valid(num_layers, pp, vp, embedding, loss):
    try:
        StageLayout.resolve(num_layers, pp, vp or 1, account_embedding=embedding,
                            account_loss=loss)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("num_layers,pp,vp,embedding,loss",
                         [case for case in _ACCOUNTED if _accounted_valid(*case)])
def test_accounted_split_equals_megatron_core(num_layers, pp, vp, embedding, loss):
    layout = StageLayout.resolve(num_layers, pp, vp or 1, account_embedding=embedding,
                                 account_loss=loss)
    config = _megatron_config(num_layers, pp, vp, embedding, loss)
    for stage in range(layout.num_stages):
        vp_stage, pp_rank = divmod(stage, pp)  # Megatron's virtual stage numbering
        count, offset = _megatron_accounted(config, pp_rank, None if vp is None else vp_stage)
        layers = layout.layers(stage)
        assert (len(layers), layers.start) == (count, offset), stage
    assert [layer for s in range(layout.num_stages) for layer in layout.layers(s)] == \
        list(range(num_layers))


def test_accounted_grid_covers_the_papers_layouts():
    valid = [case for case in _ACCOUNTED if _accounted_valid(*case)]
    assert len(valid) > 60
    for case in [(38, 8, 5, True, True), (22, 8, 3, True, True), (30, 8, 4, True, True),
                 (46, 16, 3, True, True), (62, 32, None, True, True), (7, 2, 2, True, False),
                 (3, 4, None, True, False)]:
        assert case in valid, case
    assert StageLayout.resolve(38, 8, 5, account_embedding=True,
                               account_loss=True).counts() == (0,) + (1,) * 38 + (0,)
    assert StageLayout.resolve(62, 32, account_embedding=True,
                               account_loss=True).counts() == (1,) + (2,) * 30 + (1,)


@pytest.mark.parametrize("num_layers,pp,vp,embedding,loss",
                         [case for case in _ACCOUNTED if not _accounted_valid(*case)])
def test_accounted_refused_where_megatron_core_refuses(num_layers, pp, vp, embedding, loss):
    with pytest.raises((ValueError, AssertionError)):
        _megatron_config(num_layers, pp, vp, embedding, loss)


def test_accounted_errors_name_the_flags():
    with pytest.raises(ValueError, match="--num-layers 8 \\+ 2 \\(the layers "
                       "--account-for-embedding-in-pipeline-split and "
                       "--account-for-loss-in-pipeline-split counts\\) = 10 must be "
                       "divisible by --pipeline-model-parallel-size 4"):
        StageLayout.resolve(8, 4, account_embedding=True, account_loss=True)
    with pytest.raises(ValueError, match="--account-for-loss-in-pipeline-split: the 5 layers "
                       "of each pipeline rank must be divisible by the model chunks per rank "
                       "\\(2, --num-model-chunks\\)"):
        StageLayout.resolve(9, 2, 2, account_loss=True)
    with pytest.raises(ValueError, match="--account-for-embedding-in-pipeline-split cannot be "
                       "combined with --decoder-first-pipeline-num-layers"):
        StageLayout.resolve(8, 2, first=3, account_embedding=True)
    with pytest.raises(ValueError):  # megatron-core refuses the combination as well
        from megatron.core.transformer.transformer_config import TransformerConfig
        TransformerConfig(num_layers=8, hidden_size=8, num_attention_heads=2,
                          pipeline_model_parallel_size=2, pipeline_dtype=torch.float32,
                          num_layers_in_first_pipeline_stage=3,
                          account_for_embedding_in_pipeline_split=True)


def test_accounted_flags_round_trip():
    layout = StageLayout.resolve(38, 8, 5, account_embedding=True, account_loss=True)
    assert layout.uneven and layout.flags == ["--account-for-embedding-in-pipeline-split",
                                              "--account-for-loss-in-pipeline-split"]
    assert StageLayout.resolve(6, 2, first=2, last=4).flags == [
        "--decoder-first-pipeline-num-layers", "2", "--decoder-last-pipeline-num-layers", "4"]
