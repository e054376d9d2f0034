"""The three Megatron-LM launch scripts of issue 33 (tests/data/megatron_scripts, shrunk in
size only) launched with torchrun on 2 ranks: each trains on the first launch, saying once
what each pasted flag became; the Llama script's FP8 block is refused once per job, one
line per flag, exit 2, no usage block."""

import json

import numpy as np
import torch

from odc_pp.testing.torchrun import launch
from tests.unit.data.tiny_hf import CHATML_PLAIN, word_level_tokenizer
from tests.unit.training.test_megatron_scripts import argv_of, read_flags, shrunk

EXTRA = ["--no-progress-bar"]


def _gpt2_byte_vocab(tmp_path) -> None:
    """GPT-2's byte-level vocabulary (256 byte symbols + <|endoftext|>, no merges) as
    --vocab-file / --merge-file, and an indexed dataset of its ids at --data-path."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    from odc_pp.data.tokenizers import GPT2BPETokenizer

    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    vocab = {symbols[b]: b for b in range(256)} | {"<|endoftext|>": 256}
    (tmp_path / "vocab_file").write_text(json.dumps(vocab))
    (tmp_path / "merge_file").write_text("#version: 0.2\n")
    tokenizer = GPT2BPETokenizer(str(tmp_path / "vocab_file"), str(tmp_path / "merge_file"))
    rng = np.random.default_rng(0)
    prefix = str(tmp_path / "data_path")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(257))
    for _ in range(64):
        text = " ".join("ab cd efg h" for _ in range(int(rng.integers(5, 40))))
        builder.add_item(torch.tensor(tokenizer.encode(text) + [tokenizer.eod]))
        builder.end_document()
    builder.finalize(prefix + ".idx")


def _sft_inputs(tmp_path) -> None:
    """A Qwen-like ChatML tokenizer at --tokenizer-model and ShareGPT conversations at
    --finetune-hf-dataset."""
    word_level_tokenizer(tmp_path / "tokenizer_model", CHATML_PLAIN)
    turns = [{"from": "human", "value": "hello there how are you"},
             {"from": "gpt", "value": "fine thanks here is the answer"}]
    (tmp_path / "dataset.jsonl").write_text(
        "\n".join(json.dumps({"conversations": turns}) for _ in range(40)) + "\n")


def _launch(tmp_path, script: str, argv: list[str], name: str):
    return launch(argv + EXTRA, nproc=2, tmp_path=tmp_path, name=name, timeout=300)


def test_llama3_script_trains_on_the_first_launch(tmp_path):
    argv = argv_of(shrunk(read_flags("train_llama3_8b_h100_fp8"), tmp_path))
    run = _launch(tmp_path, "train_llama3_8b_h100_fp8", argv + ["--trace", str(tmp_path / "t.json")],
                  "llama")
    assert run.returncode == 0, run.describe()
    assert len(run.records()) == 4  # --train-samples 32 / --global-batch-size 8
    for note in ("note: --use-mcore-models:", "note: --sequence-parallel at "
                 "--tensor-model-parallel-size 1", "note: --train-samples 32 -> --train-iters 4",
                 "note: --attention-backend fused:"):
        assert run.stdout.count(note) == 1, (note, run.describe())


def test_llama3_fp8_block_is_refused_once_per_job_without_usage(tmp_path):
    flags = shrunk(read_flags("train_llama3_8b_h100_fp8"), tmp_path) + \
        read_flags("train_llama3_8b_h100_fp8.dtype_fp8")
    run = launch(argv_of(flags) + EXTRA, nproc=2, tmp_path=tmp_path, name="fp8", log=False,
                 timeout=120)
    assert run.returncode != 0, run.describe()  # 2 from each rank; torchrun exits 1
    assert run.stderr.count("error: 4 flags not taken:") == 1, run.describe()
    for tokens in read_flags("train_llama3_8b_h100_fp8.dtype_fp8"):
        assert run.stderr.count(f"  {tokens[0]}") == 1, run.describe()
    assert "usage:" not in run.stderr


def test_gpt3_script_trains_on_the_first_launch(tmp_path):
    _gpt2_byte_vocab(tmp_path)
    argv = argv_of(shrunk(read_flags("train_gpt3_175b_distributed"), tmp_path))
    run = _launch(tmp_path, "train_gpt3_175b_distributed", argv, "gpt3")
    assert run.returncode == 0, run.describe()
    # --log-interval 100: the last iteration is logged; fp16 starts at Megatron's 2**32
    # loss scale, so the first steps overflow, are skipped and halve it
    last = run.records()[-1]
    assert last["iteration"] == 4 and np.isfinite(last["loss"]), run.describe()
    assert last["skipped_iterations"] >= 1 and last["loss_scale"] < 2.0 ** 32
    for note in ("note: --fp16", "note: --rampup-batch-size", "note: samples: Megatron's "
                 "construction"):
        assert run.stdout.count(note) == 1, (note, run.describe())


def test_modelopt_sft_script_trains_on_the_first_launch(tmp_path):
    _sft_inputs(tmp_path)
    # --global-batch-size is not given: Megatron's micro-batch x dp = 1 sample per step
    few = {"--train-samples": "6", "--lr-decay-samples": "6"}
    flags = [[t[0], few[t[0]]] if t[0] in few else t
             for t in shrunk(read_flags("modelopt_finetune_qwen2.5_0.5b"), tmp_path)]
    # its --load: a checkpoint of the same model (the Megatron conversion of Qwen2.5)
    base = [t for t in flags if t[0] not in ("--load", "--finetune", "--save")]
    made = _launch(tmp_path, "modelopt", argv_of(base) + [
        "--save", str(tmp_path / "mlm_model_ckpt")], "base")
    assert made.returncode == 0, made.describe()
    run = _launch(tmp_path, "modelopt_finetune_qwen2.5_0.5b", argv_of(flags), "sft")
    assert run.returncode == 0, run.describe()
    last = run.records()[-1]  # --log-interval 100: the last iteration is logged
    assert last["iteration"] == 6 and np.isfinite(last["loss"]), run.describe()
    assert "note: samples: one document per sample" in run.stdout
    for note in ("note: --finetune-hf-dataset", "note: --use-mcore-models:"):
        assert run.stdout.count(note) == 1, (note, run.describe())
