"""Layer residency keeps the embedding gathered where the memory plan allows (issue 50,
item 4): ``plan_memory.embedding_kept`` is True exactly when the plan with the embedding
kept fits the budget; the plan then counts it among the kept parameters instead of the F
transient, and the chunk no longer names it among the modules gathered per use."""

from __future__ import annotations

import pytest

FLAGS = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
         "--seq-length", "64", "--max-position-embeddings", "64", "--mock-data",
         "--vocab-size", "8192", "--untie-embeddings-and-output-weights",
         "--micro-batch-size", "1", "--global-batch-size", "8", "--lr", "1e-3",
         "--pipeline-model-parallel-size", "2", "--pipeline-schedule", "1f1b"]


def _job():
    from odc_pp.training.arguments import parse_args

    return parse_args(FLAGS).resolve(4, 4)  # pp=2 x dp=2


def test_embedding_kept_exactly_where_the_plan_with_it_fits():
    from odc_pp.training.plan_memory import embedding_kept, job_peaks

    job = _job()
    per_use = job_peaks(job, "layer")
    kept = job_peaks(job, "layer", keep_embedding=True)
    # pipeline rank 0 holds the embedding: kept costs its gathered copy for the whole
    # minibatch (8192 x 64 x 4 B) instead of F's transient (it with layer 0 gathered)
    assert kept[0] > per_use[0] and kept[1] == per_use[1]
    assert embedding_kept(job, "layer", budget_bytes=max(kept))
    assert not embedding_kept(job, "layer", budget_bytes=max(kept) - 1)
    assert not embedding_kept(job, "layer", budget_bytes=None)  # no budget known
    assert not embedding_kept(job, "minibatch", budget_bytes=max(kept) * 10)


def _residency_modules(rank, world):
    from odc_pp.megatron.model import ModelConfig, build_chunks
    from odc_pp.training.distributed import standalone_process_groups

    config = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_attention_heads=4,
                         max_sequence_length=16)  # untied
    (chunk,) = build_chunks(config, pp_rank=0, pp_size=1,
                            process_groups=standalone_process_groups())
    per_use = chunk.residency_modules()
    kept = chunk.residency_modules(keep_embedding=True)
    return (per_use[0] == (chunk.model.embedding, False), kept == per_use[1:],
            len(kept) == 2)


@pytest.mark.multiproc
def test_a_kept_embedding_is_not_gathered_per_use():
    from odc_pp.testing.launch import LaunchConfig, run_workers

    assert run_workers(_residency_modules, 1, config=LaunchConfig(timeout_s=120)) == \
        [(True, True, True)]
