"""--trace: the measured timeline of a pp=2 x dp=2 run (issue 22's must-show): every
rank's actions present, in schedule order, idle agreeing with the log within 5%."""

import json

import pytest

from odc_pp.runtime.trace import TRACE_TIDS, trace_idle
from odc_pp.testing.torchrun import TINY_MODEL, launch

FLAGS = TINY_MODEL + ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1",
                      "--dp-mode", "odc", "--load-balance", "lb-mini", "--train-iters", "3"]


@pytest.mark.multiproc
def test_trace_of_pp2_dp2_run_has_every_action_in_order_and_the_logged_idle(tmp_path):
    from odc_pp.schedule.costs import CostModel
    from odc_pp.training.arguments import parse_args
    from odc_pp.schedule.build import build
    from odc_pp.training.schedules import training_request

    path = tmp_path / "run.trace.json"
    run = launch(FLAGS + ["--trace", str(path)], nproc=4, tmp_path=tmp_path, name="trace")
    assert run.returncode == 0, run.describe()
    assert (tmp_path / "run.trace.png").is_file()
    trace = json.loads(path.read_text())
    records = run.records()
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "process_name"}
    assert sorted(names) == [0, 1, 2, 3]
    args = parse_args(FLAGS)
    for record in records:
        iteration = record["iteration"]
        for rank, label in names.items():
            pp_rank = int(label.split("pp ")[1].split(",")[0])
            dp_rank = int(label.split("dp ")[1].rstrip(")"))
            count = record["microbatches_per_replica"][dp_rank]
            schedule = build(training_request(args.schedule, pp=2, num_microbatches=count),
                             CostModel())
            expected = [f"{a.kind.value} mb{a.microbatch} c{a.chunk}"
                        for a in schedule.compute_actions(pp_rank)]
            compute = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"
                              and e["pid"] == rank and e["tid"] == TRACE_TIDS["compute"]
                              and e["args"]["iteration"] == iteration),
                             key=lambda e: e["args"]["order"])
            assert [e["name"] for e in compute] == expected, (rank, iteration)
            starts = [e["ts"] for e in compute]
            assert starts == sorted(starts)  # executed in schedule order
            assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(compute, compute[1:]))
    idle = trace_idle(trace)
    for record in records:
        for rank, logged in enumerate(record["idle_s"]):
            measured = idle[(rank, record["iteration"])]
            assert measured == pytest.approx(logged, rel=0.05, abs=1e-4), (rank, record)
