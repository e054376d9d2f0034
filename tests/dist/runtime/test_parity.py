"""Every schedule family on pp=2 and pp=4 trains the megatron-core GPT exactly like a
single-process run (3 AdamW steps, microbatches of different sequence lengths).
``+pv``: post-validated AdamW with clipping vs synchronous clipping; ``+hdr``: shapes
travel as headers instead of being derived from the microbatch; ``hand-*``: hand-written
compute-only schedules lowered by ``lower_communication``;
``+bf16``: bfloat16 parameters against a bfloat16 single-process run; ``+fill``: W's
moved into the gaps unequal costs leave (``generators.gaps``); ``offload+po-h``,
``+po-f``, ``+gis-h``: PipeOffload's orders with selective offload (``_parity``)."""

import json

import pytest

from odc_pp.testing.launch import LaunchConfig, run_workers
from tests.dist.runtime._parity import parity_worker

SCHEDULES = ["1f1b", "interleaved", "zb-h1", "zb-h2", "zb-auto", "zbv", "v-half", "v-min",
             "offload", "dualpipev", "gis"]
TOLERANCE = 1e-5


def _check(report, names):
    assert sorted(report) == sorted(names)
    for name in names:
        entry = report[name]
        assert not entry["missing"], (name, entry["missing"])
        assert entry["loss_rel_diff"] <= TOLERANCE, (name, entry)
        assert entry["param_rel_diff"] <= TOLERANCE, (name, entry)
        if name.endswith("+pv"):  # every step needed clipping and was redone
            assert entry["post_validation"] == ["clipped"] * 3, (name, entry)


@pytest.mark.multiproc
@pytest.mark.parametrize("pp,extra", [(2, ["zb-h1+pv", "zbv+pv", "zbv+hdr", "hand-v",
                                           "zbv+bf16", "interleaved+fill", "zbv+fill",
                                           "offload+po-h", "offload+po-f"]),
                                      (4, ["1f1b+pv", "interleaved+hdr", "dualpipev+hdr",
                                           "hand-zb", "zb-h2+bf16", "1f1b+fill",
                                           "offload+po-f", "offload+gis-h"])])
def test_schedules_match_single_process(tmp_path, pp, extra):
    names = SCHEDULES + extra
    out = tmp_path / "parity.json"
    run_workers(parity_worker, pp, names, 8, str(out), config=LaunchConfig(timeout_s=400))
    _check(json.loads(out.read_text()), names)
