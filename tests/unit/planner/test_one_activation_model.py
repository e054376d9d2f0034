"""One activation model (issue 48): the planner's own estimate (``odc-pp plan``'s first
ranking, ``odc-pp tune-offload``) and the dry run's memory model
(``odc_pp.training.plan_memory``, what the plan prints) give a layer the same saved
bytes; no two functions share the name ``chunk_bytes`` and ``GB`` is defined once.

Before, the planner used Korthikanti's 34 sbh (GQA / gated MLP widths) and the dry run's
model the calibrated coefficients: 17% apart for a GPT layer, 4% for Llama-3-8B's. Both
now read the table the dry run measured per layer kind (``test_layer_table``)."""

from __future__ import annotations

import ast
import pathlib

import pytest

from odc_pp.planner.memory import Workload, layer_activation_bytes
from odc_pp.planner.model import ModelShape
from odc_pp.training.arguments import parse_args
from odc_pp.training.plan_memory import chunk_sizes

PACKAGE = pathlib.Path(__file__).resolve().parents[3] / "odc_pp"
LLAMA = ("--num-layers 8 --hidden-size 4096 --num-attention-heads 32 --group-query-attention "
         "--num-query-groups 8 --ffn-hidden-size 14336 --swiglu --normalization RMSNorm "
         "--vocab-size 128256 --seq-length 8192 --bf16 --mock-data")
GPT = ("--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --vocab-size 50304 "
       "--seq-length 4096 --bf16 --mock-data")


def _shape(model) -> ModelShape:
    return ModelShape.of(model, model.vocab_size)


@pytest.mark.parametrize("flags", [LLAMA, GPT], ids=["llama", "gpt"])
@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("recompute", [False, True])
def test_planner_and_dry_run_model_give_a_layer_the_same_bytes(flags, tp, recompute):
    model = parse_args(flags.split() + (["--recompute-lgd"] if recompute else [])).model
    tokens, h = model.seq_length, model.hidden_size
    # a middle chunk of 2 and of 4 layers: saved = its input (2 h / tp per token) + layers
    per_layer = [(chunk_sizes(model, tokens=tokens, layers=n, last=False, tp=tp,
                              vocab_size=model.vocab_size).saved - tokens * 2 * h // tp) / n
                 for n in (2, 4)]
    planner = layer_activation_bytes(Workload(model=_shape(model), seq_length=tokens),
                                     recompute=recompute, tp=tp, sequence_parallel=tp > 1)
    assert per_layer[0] == pytest.approx(per_layer[1], rel=1e-6)
    assert planner == pytest.approx(per_layer[0], rel=1e-6)


def _definitions(kind) -> dict[str, list[str]]:
    """Module-level function names (``kind`` ast.FunctionDef) or assigned names
    (ast.Assign) of odc_pp, each with the modules defining it."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if kind is ast.FunctionDef and isinstance(node, ast.FunctionDef):
                names = [node.name]
            elif kind is ast.Assign and isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            else:
                continue
            for name in names:
                found.setdefault(name, []).append(str(path.relative_to(PACKAGE)))
    return found


def test_gb_is_defined_once_and_chunk_bytes_names_one_function():
    assert len(_definitions(ast.Assign).get("GB", [])) == 1, _definitions(ast.Assign)["GB"]
    assert len(_definitions(ast.FunctionDef).get("chunk_bytes", [])) <= 1
