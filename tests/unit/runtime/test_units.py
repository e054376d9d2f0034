"""Single-process unit tests: deferred wgrad, saved-activation store, configs, headers."""

import types

import pytest
import torch
import torch.nn.functional as F

from odc_pp.data import Microbatch
from odc_pp.runtime import ActivationStore, RuntimeConfig, WeightGradQueue
from odc_pp.runtime.p2p import _decode_header, _encode_header


def _linear_problem(seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 3, 8, generator=generator, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(6, 8, generator=generator))
    bias = torch.nn.Parameter(torch.randn(6, generator=generator))
    upstream = torch.randn(5, 3, 6, generator=generator)
    return x, weight, bias, upstream


def _reference_grads():
    x, weight, bias, upstream = _linear_problem()
    F.linear(x, weight, bias).backward(upstream)
    return x.grad, weight.grad, bias.grad


def test_deferred_wgrad_runs_at_flush_and_matches_autograd():
    from odc_pp.megatron.layers import _DeferrableLinearFunction

    ref_x, ref_w, ref_b = _reference_grads()
    queue = WeightGradQueue()
    layer = types.SimpleNamespace(wgrad_queue=queue)
    x, weight, bias, upstream = _linear_problem()
    out = _DeferrableLinearFunction.apply(x, weight, bias, layer, None)
    with queue.deferring(chunk=1, microbatch=4):
        out.backward(upstream)
    assert weight.grad is None  # deferred
    assert torch.allclose(x.grad, ref_x) and torch.allclose(bias.grad, ref_b)
    assert queue.pending_keys() == [(1, 4)]
    # W holds the layer input and the output gradient (float32) until it runs
    assert queue.pending_bytes(1, 4) == (x.numel() + upstream.numel()) * 4
    assert queue.pending_bytes(1, 0) == 0
    assert queue.flush(1, 0) == 0  # another microbatch has nothing queued
    assert queue.flush(1, 4) == 1
    assert queue.pending_bytes(1, 4) == 0
    assert torch.allclose(weight.grad, ref_w, rtol=1e-6, atol=1e-6)
    assert len(queue) == 0


def test_a_queue_claims_back_chunks_a_later_runtime_bound():
    """Two runtimes on the same chunks (a benchmark comparing schedules): the one that
    runs must defer into its own queue, or its B runs W at once and its W finds nothing."""
    from odc_pp.megatron.layers import _DeferrableLinearFunction

    module = torch.nn.Module()
    module.layer = torch.nn.Module()
    module.layer.wgrad_queue, module.layer.native_autograd = None, False
    first, second = WeightGradQueue(), WeightGradQueue()
    assert first.attach(0, module) == 1 and second.attach(0, module) == 1
    first.claim()
    x, weight, bias, upstream = _linear_problem()
    out = _DeferrableLinearFunction.apply(x, weight, bias, module.layer, None)
    with first.deferring(chunk=0, microbatch=0):
        out.backward(upstream)
    assert weight.grad is None and first.pending_keys() == [(0, 0)]
    assert first.flush(0, 0) == 1 and weight.grad is not None


def test_held_bytes_count_distinct_fake_tensors_of_one_shape():
    """The memory dry run's fake tensors all have storage address 0: two equal-shape
    tensors held by one deferred W are still two (and a view of one is not a third)."""
    import functools

    from torch._subclasses.fake_tensor import FakeTensorMode

    queue = WeightGradQueue()
    with FakeTensorMode():
        a, b = torch.empty(4, 8), torch.empty(4, 8)
        with queue.deferring(chunk=0, microbatch=0):
            queue.put(functools.partial(lambda *t: None, a, b, a.view(32)[:32].view(4, 8)))
    assert queue.pending_bytes(0, 0) == 2 * 4 * 8 * 4


def test_wgrad_is_immediate_without_deferral_and_accumulates():
    from odc_pp.megatron.layers import _DeferrableLinearFunction

    _, ref_w, _ = _reference_grads()
    layer = types.SimpleNamespace(wgrad_queue=WeightGradQueue())
    x, weight, bias, upstream = _linear_problem()
    for _ in range(2):
        _DeferrableLinearFunction.apply(x, weight, bias, layer, None).backward(upstream)
    assert torch.allclose(weight.grad, 2 * ref_w, rtol=1e-6, atol=1e-6)


def test_activation_store_offload_reload_accounting_and_values():
    weight = torch.nn.Parameter(torch.randn(16, 16))
    store = ActivationStore(parameters=[weight], device="cpu", min_offload_bytes=0)
    x = torch.randn(32, 16, requires_grad=True)
    with store.capture((0, 0)):
        out = torch.tanh(x @ weight).sum()
    resident = store.resident_bytes
    assert resident > 0 and store.captured_bytes[(0, 0)] == resident
    assert store.offload((0, 0)) == resident  # everything but the parameter moved
    assert store.resident_bytes == 0 and store.host_bytes == resident
    store.reload((0, 0))
    assert store.resident_bytes == resident and store.host_bytes == 0
    store.offload((0, 0))  # backward reloads on demand when no RELOAD ran
    out.backward()
    expected = torch.autograd.grad(torch.tanh(x @ weight).sum(), x)[0]
    assert torch.allclose(x.grad, expected)
    store.release((0, 0))
    assert store.resident_bytes == 0 and store.host_bytes == 0 and len(store) == 0
    assert store.peak_resident_bytes == resident


def test_activation_store_counts_what_weight_gradients_hold_until_w():
    store = ActivationStore(parameters=[], device="cpu", min_offload_bytes=0)
    x = torch.randn(32, 16, requires_grad=True)
    with store.capture((0, 0)):
        out = torch.tanh(x).sum()
    saved = store.resident_bytes
    out.backward()
    store.release((0, 0))
    store.hold_for_weight_grad((0, 0), 3 * saved)  # e.g. a kept gathered input
    assert store.resident_bytes == 3 * saved and store.peak_resident_bytes == 3 * saved
    store.release_weight_grad((0, 0))
    store.release_weight_grad((0, 0))  # nothing held any more: no change
    assert store.resident_bytes == 0 and store.peak_resident_bytes == 3 * saved


def test_offload_before_forward_is_a_clear_error():
    store = ActivationStore(parameters=[], device="cpu")
    with pytest.raises(ValueError, match="before its forward"):
        store.offload((0, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_shape_header_roundtrip(dtype):
    tensor = torch.zeros(7, 2, 64, dtype=dtype)
    decoded_dtype, shape = _decode_header(_encode_header(tensor, torch.device("cpu")))
    assert decoded_dtype == dtype and shape == [7, 2, 64]


def test_configs_reject_bad_values():
    from odc_pp.megatron.model import ModelConfig, stage_layers

    with pytest.raises(ValueError, match="comm_timeout_s"):
        RuntimeConfig(comm_timeout_s=0)
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(hidden_size=66, num_attention_heads=4)
    with pytest.raises(ValueError, match="params_dtype"):
        ModelConfig(params_dtype="float8")
    with pytest.raises(ValueError, match="at least one layer per stage"):
        stage_layers(3, 4, 0)
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        Microbatch(tokens=torch.zeros(4, dtype=torch.long))


def test_stage_layers_cover_the_model_once():
    from odc_pp.megatron.model import stage_layers

    for num_layers, num_stages in [(8, 8), (10, 4), (7, 3)]:
        covered = [layer for stage in range(num_stages)
                   for layer in stage_layers(num_layers, num_stages, stage)]
        assert covered == list(range(num_layers))


def test_prepost_receives_needs_known_shapes():
    with pytest.raises(ValueError, match="shapes_from_microbatch"):
        RuntimeConfig(prepost_receives=True, shapes_from_microbatch=False)
    RuntimeConfig(prepost_receives=False, shapes_from_microbatch=False)


def test_simulator_charges_message_cpu_to_the_sending_rank():
    """The profiler's per-SEND CPU time blocks the sender: rank 0's compute after its
    first SEND starts exactly t_send_cpu later; the 0 default changes nothing."""
    from odc_pp.schedule.costs import CostModel
    from odc_pp.schedule.generators import generate
    from odc_pp.schedule.ir import ActionKind
    from odc_pp.schedule.lowering import lower
    from odc_pp.schedule.simulator import simulate

    base = CostModel(t_f=1.0, t_b=1.0, t_w=1.0, t_comm=0.1)
    schedule = lower(generate("1f1b", pp=2, num_microbatches=4, costs=base), base)
    actions = schedule.ranks[0]
    first_send = next(i for i, a in enumerate(actions) if a.kind is ActionKind.SEND_F)
    after = next(a for a in actions[first_send:] if a.is_compute)
    free = simulate(schedule, base)
    charged = simulate(schedule, CostModel(t_f=1.0, t_b=1.0, t_w=1.0, t_comm=0.1,
                                           t_send_cpu=0.25))
    assert charged.start[after] == pytest.approx(free.start[after] + 0.25)
    assert charged.makespan > free.makespan
    with pytest.raises(ValueError, match="t_send_cpu"):
        CostModel(t_send_cpu=-1.0)
