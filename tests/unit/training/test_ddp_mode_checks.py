"""``--dp-mode ddp`` without processes: its layout and transport, the checks that refuse
what it cannot run (unequal microbatch counts, layer residency, per-microbatch pushes),
and the memory formula of its replicated parameters."""

from types import SimpleNamespace

import pytest

from odc_pp.layout import DataParallelMode, ParallelLayout
from odc_pp.odc.engine_config import OdcConfig, accumulates_locally
from odc_pp.planner.memory import UnitSizes, state_bytes
from odc_pp.training.arguments import parse_args

BASE = ["--mock-data", "--vocab-size", "64", "--num-attention-heads", "4",
        "--global-batch-size", "8"]


def test_ddp_runs_collectives_and_needs_no_cuda_ipc():
    mode = DataParallelMode.parse("ddp")
    assert mode.is_ddp and mode.transport == "collective"
    assert not (mode.is_odc or mode.is_collective or mode.is_hierarchical)
    layout = ParallelLayout.resolve(SimpleNamespace(
        pipeline_model_parallel_size=1, tensor_model_parallel_size=1,
        context_parallel_size=1, dp_mode="ddp", dp_ranks_per_host=None), 2)
    assert layout.without_cuda_ipc("no peer access") is layout


def test_ddp_refuses_lb_mini_with_a_hint():
    args = parse_args(BASE + ["--dp-mode", "ddp", "--load-balance", "lb-mini"])
    with pytest.raises(ValueError, match="--dp-mode ddp needs equal microbatch counts.*"
                                         "--load-balance balanced"):
        args.resolve(2)
    assert parse_args(BASE + ["--dp-mode", "ddp", "--load-balance", "balanced"]
                      ).resolve(2).layout.mode.is_ddp
    assert parse_args(BASE + ["--dp-mode", "ddp", "--load-balance", "lb-mini"]
                      ).resolve(1).layout.dp == 1  # one replica: nothing to equalise


def test_ddp_engine_config_accumulates_locally_and_refuses_the_rest():
    config = OdcConfig(mode="ddp", unit_driver="pipeline")
    assert accumulates_locally(config, dp=8, deterministic=False)
    with pytest.raises(ValueError, match="mode='ddp' needs unit_driver='pipeline'"):
        OdcConfig(mode="ddp")
    with pytest.raises(ValueError, match="mode='ddp' needs"):
        OdcConfig(mode="ddp", unit_driver="pipeline", grad_accumulation="push")
    with pytest.raises(ValueError, match="param_residency='layer' needs"):
        OdcConfig(mode="ddp", unit_driver="pipeline", param_residency="layer")


def test_replicated_state_is_padded_parameters_and_no_separate_shard():
    sizes = dict(unit_params=(10, 7), dp=4, param_bytes=2, deterministic=True,
                 post_validation=False, local_grads=True)
    ddp = state_bytes(UnitSizes(replicated=True, **sizes))
    odc = state_bytes(UnitSizes(**sizes))
    assert ddp["params_sharded"] == 0 and odc["params_sharded"] == 2 * (3 + 2)
    assert ddp["params_gathered"] == 2 * 4 * (3 + 2)  # padded to whole shards
    assert odc["params_gathered"] == 2 * 17
    assert {k: v for k, v in ddp.items() if not k.startswith("params")} == \
        {k: v for k, v in odc.items() if not k.startswith("params")}


def test_the_planner_state_of_ddp_is_megatrons_distributed_optimizer():
    """bf16 parameters, fp32 gradients: 6 + 12/dp bytes per parameter beside the fp32
    gradient shard the engine accumulates into (4/dp): 6 + 16/dp in all."""
    from odc_pp.planner.memory import planned_state_bytes

    params = 8 * 1000
    ddp = planned_state_bytes([params], dp=8, replicated=True)
    assert ddp == (2 + 4) * params + (4 + 12) * params // 8
    assert planned_state_bytes([params], dp=8) - ddp == 2 * params // 8  # odc: own shard


def test_ddp_refuses_layer_residency_naming_the_flag():
    with pytest.raises(ValueError, match="--odc-param-residency layer .*--dp-mode ddp"):
        parse_args(BASE + ["--dp-mode", "ddp", "--odc-param-residency", "layer"]).resolve(2)
