"""Answers to Megatron-LM's supervised fine-tuning, checkpoint-argument, timing and
TensorBoard flags, its tokenizer names and its virtual-pipeline flags (the flags of a
Megatron-style Llama-2 SFT script, tests/data/megatron_scripts): entries of the one table
:data:`~odc_pp.training.megatron_flags.PASTED_FLAGS`, values of odc-pp's
``--tokenizer-type`` and :func:`virtual_pipeline`, which turns Megatron's virtual pipeline
size into ``--num-model-chunks`` before the table is applied.
"""

from __future__ import annotations

from .megatron_flag_kinds import PastedFlag, honoured, mapped, noop, rejected, value_of

__all__ = ["SFT_FLAGS", "TOKENIZER_VALUES", "VIRTUAL_PIPELINE_FLAGS", "virtual_pipeline",
           "choice_hint"]

_TRACE = "per-action timings (F, B, W, communication, every rank) are written by --trace FILE"
_SINGLE_OR_CYCLIC = (
    "the data order does not depend on it: global batches read the sample index in order "
    "(Megatron's GPTDataset shuffle with --sample-construction megatron; a new seeded "
    "permutation each pass over the data for one-document samples, as the cyclic loader)")
_VIRTUAL = ("Megatron's virtual pipeline: maps to --num-model-chunks (layers per pipeline "
            "rank / this value, as Megatron) and, without --pipeline-schedule, the "
            "interleaved 1F1B schedule (--pipeline-schedule interleaved)")

SFT_FLAGS: dict[str, PastedFlag] = {
    "--sft": mapped(
        "Megatron's SFT dataset: maps to --sample-construction document (unless given): one "
        "conversation per sample, JSONL 'messages' (or ShareGPT 'conversations') records "
        "through the tokenizer's chat template, loss on the assistant turns only",
        "--sample-construction", "document"),
    "--sft-tokenizer-prompt-format": noop(
        "conversations are formatted by the tokenizer's own chat template", takes_value=True),
    "--dataloader-type": PastedFlag(
        takes_value=True, action="by-value",
        message="--dataloader-type takes single or cyclic here (no external data loader: "
                "give --data-path)",
        by_value=(("single", noop(_SINGLE_OR_CYCLIC, takes_value=True)),
                  ("cyclic", noop(_SINGLE_OR_CYCLIC, takes_value=True)))),
    "--use-checkpoint-args": noop(
        "odc-pp does not take flags from the checkpoint, it checks them: --load stops with "
        "one line per model flag that differs from the checkpoint's, so a run that starts "
        "trains the checkpoint's model (under --finetune a Megatron checkpoint's "
        "differences are listed instead: give its shape flags)"),
    "--exit-on-missing-checkpoint": honoured(
        "--load without a checkpoint stops the job (unless --load-optional, or --load is "
        "also --save: resume-or-start)"),
    "--timing-log-level": PastedFlag(
        takes_value=True, action="by-value",
        message="--timing-log-level takes 0, 1 or 2",
        by_value=(("0", noop("every log line has the iteration time", takes_value=True)),
                  ("1", noop(f"every log line has the iteration time and each rank's idle "
                             f"time; {_TRACE}", takes_value=True)),
                  ("2", mapped(f"maps to --trace timers_trace.json (unless --trace is "
                               f"given): {_TRACE}", "--trace", "timers_trace.json")))),
    "--timing-log-option": noop(f"every rank's idle time is logged; {_TRACE}",
                                takes_value=True),
    "--tensorboard-queue-size": noop(
        "TensorBoard events are flushed after every record written", takes_value=True),
    "--log-batch-size-to-tensorboard": honoured(
        "batch-size is written to TensorBoard with every record"),
    "--log-throughput-to-tensorboard": honoured(
        "odc-pp's throughput (tokens_per_s, tflops_per_device) is written to TensorBoard "
        "with every record"),
    "--log-loss-scale-to-tensorboard": honoured(
        "loss-scale is written to TensorBoard with every --fp16 record"),
    "--log-memory-to-tensorboard": honoured(
        "peak memory (peak_memory_mb, peak_allocated_mb) is written to TensorBoard with "
        "every record"),
    "--log-world-size-to-tensorboard": rejected(
        "the world size is fixed for a run (the log's layout line); odc-pp does not write "
        "it to TensorBoard: drop the flag"),
    "--num-layers-per-virtual-pipeline-stage": PastedFlag(
        takes_value=True, action="mapped", message=_VIRTUAL),
    "--num-virtual-stages-per-pipeline-rank": PastedFlag(
        takes_value=True, action="mapped", message=_VIRTUAL.replace(
            "layers per pipeline rank / this value", "this value")),
}

_HF = ("HuggingFaceTokenizer: --tokenizer-model is the model's Hugging Face tokenizer "
       "directory (tokenizer.json or tokenizer.model with tokenizer_config.json)")
TOKENIZER_VALUES: dict[tuple[str, str], tuple[tuple[str, ...], str, str | None]] = {
    ("--tokenizer-type", name): (("--tokenizer-type", "HuggingFaceTokenizer"),
                                 f"Megatron's {name} ({kind}) maps to {_HF}", "--tokenizer-model")
    for name, kind in (("Llama2Tokenizer", "SentencePiece"), ("Llama3Tokenizer", "tiktoken"),
                       ("SentencePieceTokenizer", "SentencePiece"),
                       ("GPTSentencePieceTokenizer", "SentencePiece"),
                       ("TikTokenizer", "tiktoken"))}
"""Megatron's tokenizer names (values of odc-pp's ``--tokenizer-type``), in the form of
:data:`~odc_pp.training.megatron_example_flags.NATIVE_VALUES`."""



def choice_hint(flag: str) -> str:
    """What the invalid-choice line of ``flag`` adds about Megatron's values ('' if
    nothing)."""
    if flag != "--tokenizer-type":
        return ""
    names = ", ".join(value for _, value in TOKENIZER_VALUES)
    return (f"; Megatron's {names} map to HuggingFaceTokenizer, NullTokenizer goes with "
            f"--mock-data")


_ACCOUNTED = ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")

VIRTUAL_PIPELINE_FLAGS = ("--num-layers-per-virtual-pipeline-stage",
                          "--num-virtual-stages-per-pipeline-rank")


def _without(argv: list[str], flags: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """``argv`` without ``flags`` and their values; the problems (a missing value)."""
    out, problems, index = [], [], 0
    while index < len(argv):
        name = argv[index].partition("=")[0]
        if name not in flags:
            out.append(argv[index])
            index += 1
        elif "=" in argv[index]:
            index += 1
        elif index + 1 < len(argv) and not argv[index + 1].startswith("--"):
            index += 2
        else:
            problems.append(f"{name} expects 1 value")
            index += 1
    return out, problems


def _chunks(argv: list[str], flag: str, value: str) -> tuple[int | None, str | None]:
    """(model chunks per pipeline rank, None) or (None, the problem)."""
    if not value.isdigit() or int(value) < 1:
        return None, f"{flag} {value}: must be a whole number >= 1"
    if flag == "--num-virtual-stages-per-pipeline-rank":
        return int(value), None
    pp, layers = value_of(argv, "--pipeline-model-parallel-size") or "1", \
        value_of(argv, "--num-layers")
    if layers is None or not layers.isdigit() or not pp.isdigit():
        return None, f"{flag} {value}: needs --num-layers (and --pipeline-model-parallel-size)"
    # Megatron counts the embedding / the loss accounted in the split as layers here too
    accounted = [f for f in _ACCOUNTED if f in argv]
    total = int(layers) + len(accounted)
    if total % int(pp) or (total // int(pp)) % int(value):
        counted = "".join(f" + 1 ({f})" for f in accounted)
        return None, (f"{flag} {value}: --num-layers {layers}{counted} / "
                      f"--pipeline-model-parallel-size {pp} must be a multiple of it "
                      f"(as Megatron)")
    return total // int(pp) // int(value), None


def virtual_pipeline(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """``argv`` with Megatron's virtual-pipeline flag (:data:`VIRTUAL_PIPELINE_FLAGS`)
    turned into ``--num-model-chunks`` (and ``--pipeline-schedule interleaved`` when no
    schedule is given), the notes and the problems."""
    given = [(flag, value_of(argv, flag)) for flag in VIRTUAL_PIPELINE_FLAGS
             if any(t.partition("=")[0] == flag for t in argv)]
    if not given:
        return argv, [], []
    out, problems = _without(argv, VIRTUAL_PIPELINE_FLAGS)
    if len(given) > 1:
        return out, [], problems + [f"give one of {' and '.join(VIRTUAL_PIPELINE_FLAGS)}"]
    flag, value = given[0]
    if problems or value is None:
        return out, [], problems or [f"{flag} expects 1 value"]
    chunks, problem = _chunks(argv, flag, value)
    if problem:
        return out, [], [problem]
    native = value_of(argv, "--num-model-chunks")
    if native is not None and native != str(chunks):
        return out, [], [f"{flag} {value} (= {chunks} model chunks) and --num-model-chunks "
                          f"{native} disagree: give one"]
    if chunks == 1:
        return out, [f"note: {flag} {value}: one model chunk per pipeline rank (Megatron: no "
                     f"virtual pipeline)"], []
    added = [] if native else ["--num-model-chunks", str(chunks)]
    if value_of(argv, "--pipeline-schedule") is None:
        added += ["--pipeline-schedule", "interleaved"]
    return out + added, [f"note: {flag} {value}: mapped: {' '.join(added) or 'no change'} "
                         f"({chunks} model chunks per pipeline rank, as Megatron's virtual "
                         f"pipeline size)"], []
