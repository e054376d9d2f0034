"""Which sample construction a run uses (``--sample-construction``), and the log line
that says so.

* ``megatron``: Megatron's ``GPTDataset`` -- documents concatenated, with their EOD, into
  ``--seq-length`` samples (:mod:`odc_pp.data.concatenated`); the default for indexed
  data (``.bin``/``.idx``), as in Megatron-LM.
* ``document``: odc-pp's post-training samples -- one document per sample, truncated to
  ``--seq-length`` (:mod:`odc_pp.data.datasets`); the default for JSONL data, for the
  synthetic long-tailed ``--mock-data`` corpus and for packed rows (``--pack-sequences``,
  ``--load-balance lb-mini``).
"""

from __future__ import annotations

__all__ = ["SAMPLE_CONSTRUCTIONS", "sample_construction", "sample_construction_problems",
           "sample_construction_note"]

SAMPLE_CONSTRUCTIONS = ("auto", "megatron", "document")
"""The values of --sample-construction."""


def _is_jsonl(path: str) -> bool:
    return path.endswith((".jsonl", ".json"))


def _packs(data) -> bool:
    return data.pack_sequences or (data.load_balance == "lb-mini"
                                   and not data.no_pack_sequences)


def sample_construction(data) -> str:
    """``megatron`` or ``document`` for the data flags (a ``DataArgs``): the explicit
    --sample-construction, else ``document`` for --mock-data, JSONL files and packed
    rows, ``megatron`` for indexed datasets."""
    if data.sample_construction != "auto":
        return data.sample_construction
    if data.mock_data or _packs(data) or any(_is_jsonl(p) for p in data.data_path or ()):
        return "document"
    return "megatron"


def sample_construction_problems(data) -> list[str]:
    """Flag combinations the chosen construction cannot honour."""
    if sample_construction(data) != "megatron":
        return []
    problems = []
    jsonl = [p for p in (data.data_path or []) + (data.valid_data_path or []) if _is_jsonl(p)]
    if jsonl:
        problems.append(f"--sample-construction megatron concatenates indexed documents; "
                        f"{jsonl[0]} is JSONL (one document per sample): preprocess it with "
                        f"tools/preprocess_data.py, or use --sample-construction document")
    if _packs(data):
        which = "--pack-sequences" if data.pack_sequences else \
            "--load-balance lb-mini (which packs by default; --no-pack-sequences)"
        problems.append(f"--sample-construction megatron gives full --seq-length samples; "
                        f"{which} packs one document per sample: drop one of them")
    return problems


def sample_construction_note(args) -> str:
    """The log's line saying how samples are built (a ``TrainingArgs``)."""
    data, seq = args.data, args.model.seq_length
    if sample_construction(data) == "megatron":
        resets = [f"--{name.replace('_', '-')}" for name in
                  ("reset_position_ids", "reset_attention_mask", "eod_mask_loss")
                  if getattr(data, name)]
        source = "the synthetic corpus (--mock-data)" if data.mock_data else "the documents"
        return (f"note: samples: Megatron's construction (GPTDataset): {source} shuffled per "
                f"epoch and concatenated with their EOD into --seq-length {seq} samples"
                f"{'; ' + ', '.join(resets) if resets else ''}")
    kind = "packed rows, " if _packs(data) else ""
    reason = ("--sample-construction document" if data.sample_construction == "document" else
              "the default for " + ("--mock-data (synthetic long-tailed lengths)"
                                    if data.mock_data else "packed rows" if _packs(data)
                                    else "JSONL data"))
    return (f"note: samples: one document per sample ({kind}truncated to --seq-length "
            f"{seq}; {reason}); --sample-construction megatron concatenates documents into "
            f"full samples as Megatron does")
