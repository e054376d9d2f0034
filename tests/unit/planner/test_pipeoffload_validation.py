"""The PipeOffload validation harness (issue 48 item 5): its data file, its mapping of the
paper's cells onto candidates, and its summary metrics on a small synthetic input."""

from __future__ import annotations

import pytest

from benchmarks import bench_pipeoffload_validation as bench


def _cell(model, seq, schedule, paper_mfu, paper_gb, *, mfu=None, gb=None, fits=None):
    cell = {"model": model, "seq": seq, "schedule": schedule, "paper_mfu_pct": paper_mfu,
            "paper_activation_gb": paper_gb, "expressible": mfu is not None}
    if mfu is not None:
        cell["predicted"] = {"mfu_pct": mfu, "activation_gb": gb, "fits": fits}
    return cell


def test_data_file_loads_with_every_figure15_cell():
    paper = bench._load()
    fig = paper["figure15"]
    assert fig["seq"] == [4096, 8192, 16384, 32768]
    for name in ("10.5B", "18.1B", "42.9B"):
        row = bench.model_row(paper, name)
        assert row["query_groups"] == 8 and "where" in row
        assert set(fig["mfu_pct"][name]) == set(bench.SCHEDULES)
        for schedule, values in fig["mfu_pct"][name].items():
            memory = fig["activation_gb"][name][schedule]
            assert len(values) == len(memory) == 4
            # a cell the paper could not run is unrun in both maps
            assert [isinstance(v, int) for v in values] == [isinstance(m, int) for m in memory]
    # the decoding's anchors: SKIP is PO-F where k > 1, host OOM on 42.9B PO-F at 32K
    for name, ks in fig["k"]["value"].items():
        skipped = [v == "SKIP" for v in fig["mfu_pct"][name]["PO-F"]]
        assert skipped == [k > 1 for k in ks]
    assert fig["mfu_pct"]["42.9B"]["PO-F"][3] == "OOM(H)"
    with pytest.raises(KeyError, match="no model"):
        bench.model_row(paper, "1T")


def test_each_cell_maps_to_a_valid_candidate_or_names_what_is_missing():
    paper = bench._load()
    v_of = paper["figure15"]["stages_per_device_v"]["value"]
    built = 0
    for name in ("10.5B", "18.1B", "42.9B"):
        row = bench.model_row(paper, name)
        for schedule in bench.SCHEDULES:
            try:
                cand, exact = bench.cell_candidate(row, schedule,
                                                   v=1 if schedule == "1F1B" else v_of[name])
            except bench.NotExpressible as exc:
                assert str(exc)  # names the missing piece
                continue
            built += 1
            assert cand.pp == row["gpus"] and cand.tp == cand.dp == 1 and cand.recompute
            # one layer off the first and last virtual stage, as the paper: every layout
            assert exact and cand.accounted == (True, True)
            if schedule in ("PO-H", "PO-F"):
                assert cand.offloaded
    assert built >= 15  # every schedule of every model: the families and fields exist
    gis_h, _ = bench.cell_candidate(bench.model_row(paper, "42.9B"), "GIS-H", v=2)
    assert (gis_h.schedule, gis_h.group_size, gis_h.num_chunks) == ("gis", 16, 2)
    po_h, _ = bench.cell_candidate(bench.model_row(paper, "10.5B"), "PO-H", v=5)
    assert po_h.offloaded == (0, 1, 2) and po_h.selective_offload and po_h.group_size == 1
    with pytest.raises(KeyError, match="unknown paper schedule"):
        bench.cell_candidate(bench.model_row(paper, "42.9B"), "ZB-V", v=2)


def test_summary_metrics_on_a_synthetic_row():
    cells = [
        _cell("m", 4096, "1F1B", 50, 10, mfu=40.0, gb=12.0, fits=True),    # +20%
        _cell("m", 4096, "1F1B-I", 60, 20, mfu=45.0, gb=15.0, fits=True),  # -25%, order ok
        _cell("m", 4096, "PO-H", 60, 4, mfu=44.0, gb=8.0, fits=False),     # +100%, paper tie
        _cell("m", 8192, "1F1B", "OOM", "OOM", mfu=41.0, gb=30.0, fits=True),  # disagrees
        _cell("m", 8192, "PO-F", "SKIP", "SKIP"),
        _cell("m", 8192, "PO-H", 55, 8, mfu=30.0, gb=8.0, fits=True),      # exact
        _cell("m", 8192, "GIS", 70, 9),                                    # not expressible
    ]
    assert bench.memory_errors(cells) == pytest.approx([20.0, -25.0, 100.0, 0.0])
    assert bench.oom_agreement(cells) == (3, 5)
    # row 4096: (1F1B, 1F1B-I) agrees; (1F1B, PO-H) agrees; (1F1B-I, PO-H) is a paper tie
    assert bench.order_agreement(cells) == (2, 3)
    assert bench.max_mfu_error(cells) == 25.0
    summary = bench.summarize(cells)
    assert summary["median_abs_memory_error_pct"] == 22.5
    assert summary["oom_agreement_fraction"] == 0.6
    assert summary["mfu_order_agreement"] == [2, 3]
    assert summary["expressible"] == 5 and summary["memory_cells"] == 4
    # a predicted tie is a disagreement too
    tie = [_cell("m", 1, "1F1B", 50, 1, mfu=40.0, gb=1.0, fits=True),
           _cell("m", 1, "PO-H", 60, 1, mfu=40.0, gb=1.0, fits=True)]
    assert bench.order_agreement(tie) == (0, 1)
