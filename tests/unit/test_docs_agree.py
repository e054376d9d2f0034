"""The docs agree with each other and with the code (issue 33, Deliver 7): claims that
once contradicted each other are checked against what the code does.

* A tied model (embedding and output layer one weight) at pp x chunks > 1 runs
  (docs/megatron_features.md, odc_pp/odc/tied.py): no doc may say it exits or is
  refused, and the parser accepts it."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
TINY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "32", "--vocab-size", "64", "--mock-data"]


def _sentences(text: str) -> list[str]:
    """Sentences of the prose; each table row and list item on its own."""
    out = []
    for block in re.split(r"\n\s*\n|\n(?=\s*[|*-] )", text):
        if block.lstrip().startswith("|"):
            out += [line for line in block.splitlines() if line.strip()]
            continue
        flat = re.sub(r"\s+", " ", block)
        out += [s.strip() for s in re.split(r"(?<=[.;:])\s+(?=[A-Z*`(])", flat) if s.strip()]
    return out


REFUSAL = re.compile(r"\b(exits? (with|2)|stops? with|exit 2|refuse[sd]?|not supported|"
                     r"is an error)\b", re.I)
TIED_ACROSS_STAGES = re.compile(r"\btied\b.*\b(pp|pipeline|stages?|chunks)\b|"
                                r"\b(pp|pipeline|stages?|chunks)\b.*\btied\b", re.I)


def tied_refusals(text: str) -> list[str]:
    """Sentences saying a tied model across pipeline stages is refused / exits."""
    return [s for s in _sentences(text)
            if TIED_ACROSS_STAGES.search(s) and REFUSAL.search(s)
            and not re.search(r"\bdiffer|copies differ|not equal|whose two copies", s, re.I)]


def test_the_detector_finds_the_old_contradiction():
    old = ("* **Tied embeddings** are tied when one chunk holds embedding and output layer "
           "(pp x chunks = 1). Across stages odc-pp has no embedding-gradient all-reduce "
           "yet, so a tied model on pp x chunks > 1 stops with exit 2 unless "
           "`--untie-embeddings` is given.")
    assert tied_refusals(old)
    assert not tied_refusals("A tied model runs on every layout: across stages (pp x "
                             "chunks > 1) the last stage holds a copy.")


def test_no_doc_says_a_tied_model_at_pp_over_1_is_refused():
    found = {str(path.relative_to(ROOT)): tied_refusals(path.read_text(encoding="utf-8"))
             for path in DOCS if path.exists()}
    assert not {k: v for k, v in found.items() if v}, found


def test_the_docs_that_describe_it_say_it_runs_and_the_parser_accepts_it():
    from odc_pp.training.arguments import parse_args

    args = parse_args(TINY + ["--pipeline-model-parallel-size", "2"])
    assert not args.model.untie_embeddings  # Megatron's default: tied
    for name in ("megatron_features.md", "models.md"):
        text = (ROOT / "docs" / name).read_text(encoding="utf-8")
        assert any(TIED_ACROSS_STAGES.search(s) for s in _sentences(text)), name
