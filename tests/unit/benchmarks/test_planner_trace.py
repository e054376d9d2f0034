"""benchmarks/planner_trace.py: the validation's calibration from pretrain_gpt.py's own
trace -- the fit per microbatch, the step's time outside its actions, the stage
transfers -- and predict() using it (issue 31: per-step and transfer terms)."""

from __future__ import annotations

import importlib
import json

import pytest

trace = importlib.import_module("benchmarks.planner_trace")
measure = importlib.import_module("benchmarks.planner_measure")


def _event(rank, iteration, cat, name, ts, dur, **args):
    return {"ph": "X", "pid": rank, "cat": cat, "name": name, "ts": ts, "dur": dur,
            "args": {"iteration": iteration, **args}}


def _write(tmp_path, events):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "M", "pid": 0}] + events}))
    return str(path)


def test_read_trace_takes_waits_out_and_measures_the_step_outside_the_actions(tmp_path):
    events = [_event(0, 2, "iteration", "iteration 2", 0, 1_000_000),
              _event(0, 2, "compute", "F mb0 c0", 100_000, 200_000, microbatch=0,
                     waited_ms=50.0),
              _event(0, 2, "compute", "B mb0 c0", 300_000, 300_000, microbatch=0,
                     waited_ms=0.0),
              _event(0, 2, "send_f", "SEND_F mb0 c0", 650_000, 10_000, microbatch=0,
                     waited_ms=0.0)]
    record = trace.read_trace(_write(tmp_path, events))[0][2]
    assert record["step_s"] == pytest.approx(1.0)
    assert record["busy"][0] == pytest.approx({"F": 0.15, "B": 0.3})
    assert record["span_s"] == pytest.approx(0.56)  # 0.1 s .. 0.66 s
    assert record["p2p_s"]["send"] == pytest.approx([0.01])


def test_fit_recovers_the_costs_of_the_planned_shapes(tmp_path):
    """A trace made from known costs of the shapes the run plans (dp=2, odc, no
    balancing): the fit gives them back, and the step's own time is the smallest over the
    ranks of step less span (the faster replica waits for the slower one)."""
    flags = measure.MODEL + trace.CALIBRATION_RUNS["odc"]
    iters, (a, b, c) = 4, (3e-7, 2e-4, 0.01)
    shapes, _, _ = trace._planned_run(flags, range(1, iters))
    events = []
    for rank in (0, 1):
        for iteration in range(1, iters + 1):
            clock, step = 0.0, (1.5 if rank else 1.4)
            for mb, (rows, tokens) in enumerate(shapes.get((iteration - 1, rank), [])):
                cost = a * rows * tokens * tokens + b * rows * tokens + c
                for kind, share in (("F", 0.3), ("B", 0.5), ("W", 0.2)):
                    events.append(_event(rank, iteration, "compute", f"{kind} mb{mb} c0",
                                         clock * 1e6, share * cost * 1e6, microbatch=mb,
                                         waited_ms=0.0))
                    clock += share * cost
            events.append(_event(rank, iteration, "iteration", f"iteration {iteration}", 0,
                                 (clock + 0.02 + rank * 0.05) * 1e6))
    fit = trace._fit_mode(flags, [trace.read_trace(_write(tmp_path, events))], iters)
    assert (fit["a"], fit["b"], fit["c_stage"]) == pytest.approx((a, b, c), rel=1e-3)
    assert fit["shares"] == pytest.approx({"F": 0.3, "B": 0.5, "W": 0.2})
    assert fit["fixed_s"] == pytest.approx(0.02, abs=1e-5)


def test_prediction_uses_the_training_fit_and_the_steps_own_time():
    """With a ``training`` calibration, predict() costs each microbatch by that mode's
    fit and adds the step's measured time outside its actions in place of the optimizer
    estimate; stage transfers' CPU time lengthens a pipeline."""
    shares = {"F": 0.33, "B": 0.5, "W": 0.17}
    fit = {"a": 4e-7, "b": 2e-4, "c_stage": 0.005, "shares": shares, "fixed_s": 0.0,
           "send_s": 0.0, "recv_s": 0.0}
    calibration = {"a": 1.0, "b": 1.0, "c": 1.0, "shares": shares, "optimizer_s": 9.0,
                   "training": {"odc": dict(fit), "collective": dict(fit),
                                "pipeline": dict(fit)}}
    for name in ("pp2-1f1b/seq512", "dp2-odc-balanced/seq1024",
                 "dp2-collective-balanced/seq512"):
        flags = measure._configs()[name]
        base = measure.predict(flags, calibration, range(1, 3))
        assert all(0.05 < s < 5.0 for s in base)  # the training fit, not a = b = c = 1
        stepped = json.loads(json.dumps(calibration))
        for mode in stepped["training"].values():
            mode["fixed_s"] = 0.03
        more = measure.predict(flags, stepped, range(1, 3))
        assert [m - b for m, b in zip(more, base)] == pytest.approx([0.03, 0.03])
    sending = json.loads(json.dumps(calibration))
    sending["training"]["pipeline"]["send_s"] = 0.01
    flags = measure._configs()["pp2-1f1b/seq512"]
    assert min(s - b for s, b in zip(measure.predict(flags, sending, range(1, 3)),
                                      measure.predict(flags, calibration, range(1, 3)))) > 0


def test_split_fixed_tells_the_fixed_cost_from_the_per_stage_cost():
    """2 virtual stages at 12 ms each (24 ms a microbatch), 4 at 8 ms (32 ms): 4 ms per
    virtual stage and 16 ms that do not grow with them."""
    per_model, per_stage = trace.split_fixed({"c_stage": 0.012, "stages": 2},
                                             {"c_stage": 0.008, "stages": 4})
    assert (per_model, per_stage) == pytest.approx((0.016, 0.004))
    assert trace.split_fixed({"c_stage": 0.012, "stages": 2},
                             {"c_stage": 0.005, "stages": 4}) == pytest.approx((0.024, 0.0))


def test_the_fixed_cost_is_paid_once_however_many_virtual_stages():
    """Moving a microbatch's fixed cost from per virtual stage to per rank makes an
    interleaved (4 virtual stages) pipeline cheaper and a 2-stage one no dearer."""
    shares = {"F": 0.33, "B": 0.5, "W": 0.17}
    staged = {"a": 4e-7, "b": 2e-4, "c_stage": 0.008, "c_rank": 0.0, "shares": shares,
              "fixed_s": 0.0, "send_s": 0.0, "recv_s": 0.0}
    once = dict(staged, c_stage=0.0, c_rank=0.016)
    for name, cheaper in (("pp2-interleaved/seq1024", True), ("pp2-zbv/seq1024", True),
                          ("pp2-1f1b/seq512", False)):
        flags = measure._configs()[name]
        times = [measure.predict(flags, {"a": 1, "b": 1, "c": 1, "shares": shares,
                                         "training": {"pipeline": fit}}, range(1, 3))
                 for fit in (staged, once)]
        if cheaper:
            assert all(o < s - 0.05 for s, o in zip(*times))
        else:
            assert all(o <= s + 1e-3 for s, o in zip(*times))


def test_collective_pays_its_reduce_scatter_after_every_microbatch():
    """Collective mode computes as ODC does (ODC's fit) and pays the measured gradient
    reduce-scatter after every microbatch: with more push time the prediction grows by at
    least the push times the microbatches of the slowest replica's critical path."""
    shares = {"F": 0.33, "B": 0.67, "W": 0.0}
    fit = {"a": 4e-7, "b": 2e-4, "c_stage": 0.01, "shares": shares, "fixed_s": 0.01,
           "send_s": 0.0, "recv_s": 0.0}
    calibration = {"a": 1.0, "b": 1.0, "c": 1.0, "shares": shares, "reduce_scatter_s": 0.0,
                   "training": {"odc": dict(fit), "collective": dict(fit, a=1.0)}}
    flags = measure._configs()["dp2-collective-balanced/seq512"]
    base = measure.predict(flags, calibration, range(1, 3))
    assert all(s < 5.0 for s in base)  # ODC's fit, not the collective run's a = 1
    pushed = measure.predict(flags, {**calibration, "reduce_scatter_s": 0.02}, range(1, 3))
    assert all(p - b >= 0.02 * 2 for p, b in zip(pushed, base))
