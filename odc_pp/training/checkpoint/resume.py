"""Checkpoints at the start of a run: the checks of ``--save`` and resuming from ``--load``.

Resume: exactly under the layout the checkpoint was saved with, or resharded
(:mod:`.resharding`) under another pipeline / data-parallel layout; with ``--finetune``
only the weights, from iteration 0 with a fresh optimizer. The saved model configuration
must equal this run's (a difference names the flag). Every file read is verified against
its checksum; when the checkpoint ``latest`` names does not verify, the newest older one
that does is loaded instead, with a warning naming the bad file (all ranks agree on it).

Every decision ranks must share is made from values gathered from every rank or broadcast
from rank 0, never from each rank's own view alone.
"""

from __future__ import annotations

import os
import shutil
import sys

import torch
import torch.distributed as dist

from odc_pp.data.tokenizer_identity import tokenizer_record
from odc_pp.fsutil import fsync_dir, write_file_atomic

from ...megatron.dist_ckpt import is_megatron_checkpoint
from ...megatron.model_identity import identity_differences, identity_of_meta
from ..arguments import CheckpointArgs, ModelArgs, TrainingArgs
from ..data_position import DATA_KEYS
from .checkpointing import (LATEST, CorruptCheckpointError, capture_rng_state, checkpoint_bytes,
                            checkpoint_dir, free_space_problem, latest_iteration,
                            list_iterations, read_meta, remove_leftovers, save_dir_problem)
from ..distributed import Topology
from .megatron_checkpoint import resume_from_megatron
from ..model_setup import hf_config_of, model_config
from .resharding import assemble_by_name, owned_state, read_optimizer_state, sharded_state, \
    unit_layout
from .resume_iteration import OVERRIDE_FLAG, recorded_iteration

__all__ = ["MODEL_FLAGS", "MODEL_KEYS", "LAYOUT_KEYS", "checkpoint_meta", "model_differences",
           "check_save_dir", "retained_copies", "resume", "refuse_newer_checkpoints"]

# the model configuration: must equal the saved values (another model cannot be resumed);
# compared by the one model-identity check (odc_pp.megatron.model_identity)
MODEL_FLAGS = {
    "num_layers": "--num-layers",
    "hidden_size": "--hidden-size",
    "num_attention_heads": "--num-attention-heads",
    "ffn_hidden_size": "--ffn-hidden-size",
    "max_position_embeddings": "--max-position-embeddings",
    "vocab_size": "--vocab-size (or the tokenizer and --make-vocab-size-divisible-by)",
    "normalization": "--normalization",
    "norm_epsilon": "--norm-epsilon",
    "apply_layernorm_1p": "--apply-layernorm-1p",
    "swiglu": "--swiglu",
    "num_query_groups": "--num-query-groups",
    "kv_channels": "--kv-channels",
    "position_embedding_type": "--position-embedding-type",
    "rotary_base": "--rotary-base",
    "disable_bias_linear": "--disable-bias-linear",
    "add_qkv_bias": "--add-qkv-bias",
    "qk_layernorm": "--qk-layernorm",
}
# architecture keys that checkpoints written before they existed lack: the GPT defaults
_ARCH_DEFAULTS = {name: getattr(ModelArgs(), name) for name in (
    "normalization", "norm_epsilon", "apply_layernorm_1p", "swiglu", "num_query_groups",
    "kv_channels", "position_embedding_type", "rotary_base", "disable_bias_linear", "add_qkv_bias",
    "qk_layernorm", "untie_embeddings", "use_rope_scaling", "rope_scaling_factor")}
MODEL_KEYS = tuple(MODEL_FLAGS)
# may differ: the optimizer state is then resharded by parameter name
LAYOUT_KEYS = ("pp", "dp", "pipeline_schedule", "num_model_chunks", "dp_mode", "world_size",
               "tp", "sequence_parallel", "cp", "decoder_first_pipeline_num_layers",
               "decoder_last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
               "account_for_loss_in_pipeline_split")
# layout keys that checkpoints written before they existed lack
_LAYOUT_DEFAULTS = {"tp": 1, "sequence_parallel": False, "cp": 1,
                    "decoder_first_pipeline_num_layers": None,
                    "decoder_last_pipeline_num_layers": None,
                    "account_for_embedding_in_pipeline_split": False,
                    "account_for_loss_in_pipeline_split": False}
_META_BYTES = 1 << 12  # meta.json of a checkpoint


def checkpoint_meta(args: TrainingArgs, topo: Topology, *, vocab_size: int) -> dict:
    """What a checkpoint records about the model and the layout that saved it."""
    return {"pp": topo.pp, "dp": topo.dp, "pipeline_schedule": args.schedule.pipeline_schedule,
            "num_model_chunks": args.schedule.num_model_chunks, "num_layers": args.model.num_layers,
            "hidden_size": args.model.hidden_size, "num_attention_heads": args.model.num_attention_heads,
            "ffn_hidden_size": args.model.ffn_hidden_size,
            "max_position_embeddings": args.model.max_position_embeddings,
            "vocab_size": vocab_size, "dp_mode": topo.dp_mode.value, "world_size": topo.world_size,
            "tp": topo.tp, "sequence_parallel": args.parallel.sequence_parallel,
            "cp": topo.cp,
            "decoder_first_pipeline_num_layers": args.parallel.decoder_first_pipeline_num_layers,
            "decoder_last_pipeline_num_layers": args.parallel.decoder_last_pipeline_num_layers,
            **{name: getattr(args.parallel, name) for name in (
                "account_for_embedding_in_pipeline_split",
                "account_for_loss_in_pipeline_split")},
            **{name: getattr(args.model, name) for name in _ARCH_DEFAULTS},
            "tie_embeddings": model_config(args.model, vocab_size=vocab_size, device="cpu",
                                           num_stages=1).tie_embeddings,
            "hf_config": hf_config_of(args.model),
            # the tokenizer used: its type, HF directory (tools/export_hf.py copies it, chat
            # template included) and the SHA-256 of its files (the export checks it)
            **_tokenizer_used(args)}


def _tokenizer_used(args: TrainingArgs) -> dict:
    if args.data.mock_data:
        return {"tokenizer_type": None, "tokenizer_dir": None, "tokenizer_sha256": None}
    return tokenizer_record(args.data.tokenizer_type, args.data.tokenizer_model,
                            vocab_file=args.data.vocab_file, merge_file=args.data.merge_file)


def model_differences(saved: dict, now: dict) -> list[str]:
    """One entry per model setting that differs: ``"key: saved A vs now B (--flag)"``
    (:func:`~odc_pp.megatron.model_identity.identity_differences` of the two metas)."""
    return identity_differences(identity_of_meta(saved), identity_of_meta(now))


# ----- collectives (default group) ------------------------------------------------------------
def _from_rank0(value, topo: Topology):
    box = [value if topo.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gather(value, topo: Topology) -> list:
    values = [None] * topo.world_size
    dist.all_gather_object(values, value)
    return values


def _same_dir(a: str | None, b: str | None) -> bool:
    return bool(a and b) and os.path.realpath(a) == os.path.realpath(b)


# ----- --save -----------------------------------------------------------------------------------
def check_save_dir(parts, checkpoint: CheckpointArgs, topo: Topology, *,
                   out=sys.stdout) -> None:
    """Collective, before the first step: every rank can write into ``--save`` and it has
    room for the checkpoints this run holds at once (:func:`retained_copies`); the
    estimate is logged. Leftovers of crashed saves / prunes are removed."""
    problem = save_dir_problem(checkpoint.save, topo.rank)
    state = dict(sharded_state(parts.engine, parts.optimizer), rng=capture_rng_state(),
                 iteration=0)
    gathered = _gather((problem, checkpoint_bytes(state)), topo)
    problems = [p for p, _ in gathered if p]  # the same list on every rank
    if problems:
        raise ValueError("; ".join(problems[:4]))
    space = None
    if topo.rank == 0:
        removed = remove_leftovers(checkpoint.save)
        if removed:
            print(f"removed leftovers of an interrupted save or prune in {checkpoint.save}: "
                  f"{', '.join(removed)}", file=out, flush=True)
        one = sum(size for _, size in gathered) + _META_BYTES
        copies = retained_copies(checkpoint)
        print(f"--save {checkpoint.save}: one checkpoint is about {one / 2 ** 20:.2f} MiB "
              f"({topo.world_size} rank files); this run holds up to {copies} of its own at "
              f"once ({_copies_why(checkpoint)}): {copies * one / 2 ** 20:.2f} MiB needed, "
              f"{shutil.disk_usage(checkpoint.save).free / 2 ** 20:.1f} MiB free",
              file=out, flush=True)
        space = free_space_problem(checkpoint.save, copies * one)
    space = _from_rank0(space, topo)
    if space:
        raise ValueError(space)


def retained_copies(checkpoint: CheckpointArgs) -> int:
    """How many of its own checkpoints a run has on disk at once: with --save-interval, the
    --keep-checkpoints it keeps plus the one being written before the oldest is pruned;
    otherwise one (the final / exit save)."""
    return checkpoint.keep_checkpoints + 1 if checkpoint.save_interval else 1


def _copies_why(checkpoint: CheckpointArgs) -> str:
    if checkpoint.save_interval:
        return (f"--keep-checkpoints {checkpoint.keep_checkpoints} + 1 being written before "
                f"the oldest is pruned")
    return "no --save-interval: only the final or exit save"


def refuse_newer_checkpoints(checkpoint: CheckpointArgs, topo: Topology, start: int) -> None:
    """Collective: ValueError when ``--save`` holds checkpoints newer than ``start`` (this
    run would overwrite or prune them) -- a fresh run pointed at an old directory."""
    problem = None
    if topo.rank == 0:
        newer = [it for it in list_iterations(checkpoint.save) if it > start]
        if newer:
            names = ", ".join(os.path.basename(checkpoint_dir(checkpoint.save, it))
                              for it in newer[-3:])
            problem = (f"--save {checkpoint.save} already holds checkpoints newer than iteration "
                       f"{start}, where this run starts ({names}); refusing to overwrite or "
                       f"prune them. ")
            if _same_dir(checkpoint.load, checkpoint.save) and not checkpoint.finetune:
                problem += (f"{os.path.join(checkpoint.save, LATEST)} names iteration {start}: "
                            f"write the iteration to resume from into it, or give a new "
                            f"--save directory")
            else:
                problem += (f"Resume from them with --load {checkpoint.save}, or give a new --save "
                            f"directory")
    problem = _from_rank0(problem, topo)
    if problem:
        raise ValueError(problem)


# ----- --load -----------------------------------------------------------------------------------
def _candidates(load: str) -> tuple[str, object]:
    """("found", iterations newest first) | ("none", why) | ("error", message)."""
    if not os.path.isdir(load):
        return "none", f"--load {load} does not exist"
    iterations = list_iterations(load)
    try:
        latest = latest_iteration(load)
    except ValueError as exc:
        return "error", str(exc)
    if latest is None:
        if iterations:
            names = ", ".join(os.path.basename(checkpoint_dir(load, it))
                              for it in iterations[-3:])
            return "error", (f"--load {load} holds checkpoints ({names}) but no '{LATEST}' "
                             f"file, so which one to resume is unknown: write the iteration "
                             f"to resume from into {os.path.join(load, LATEST)}, or give a "
                             f"new --save directory for a fresh run")
        return "none", f"--load {load} holds no checkpoint"
    return "found", [it for it in reversed(iterations) if it <= latest]


def _read(parts, args: TrainingArgs, topo: Topology, directory: str, now: dict):
    """This rank's reading of one checkpoint: ("ok", how, (state, saved file or None,
    iteration it records, data position it records)), ("corrupt", message, None) or
    ("fatal", message, None). Local: waits for no peer."""
    try:
        meta = read_meta(directory)
        differences = model_differences(meta, now)
        if differences:
            return "fatal", (f"checkpoint {directory} holds another model "
                             f"({'; '.join(differences)}); resume with the model flags it "
                             f"was saved with"), None
        if args.checkpoint.finetune:
            _, tensors = assemble_by_name(directory, meta["world_size"])
            state = owned_state(tensors, 0, unit_layout(parts.engine),
                                parts.engine.owned_params()[0].device)
            for key in ("exp_avg", "exp_avg_sq"):
                state[key] = [torch.zeros_like(tensor) for tensor in state[key]]
            return "ok", "finetune", (state, None, 0, None)
        override = args.checkpoint.override_resume_iteration
        recorded = meta.get("iteration") if override is not None else \
            recorded_iteration(directory, meta)
        changed = [k for k in LAYOUT_KEYS if meta.get(k, _LAYOUT_DEFAULTS.get(k)) != now[k]]
        state, saved = read_optimizer_state(directory, parts.engine, rank=topo.rank,
                                            saved_world_size=meta["world_size"],
                                            exact=not changed,
                                            iteration=None if override is not None else recorded)
        data = _data_record(meta, saved)
        if saved is not None:
            return "ok", "exact", (state, saved, recorded, data)
        detail = ", ".join(f"{k} {meta.get(k)} -> {now[k]}" for k in changed) or \
            "the units' parameter layout differs"
        return "ok", f"resharded ({detail}; RNG streams restart)", (state, None, recorded, data)
    except (CorruptCheckpointError, OSError) as exc:  # unreadable: try an older one
        return "corrupt", str(exc), None
    except ValueError as exc:
        return "fatal", str(exc), None


def resume(parts, args: TrainingArgs, topo: Topology, set_rng_state, *, vocab_size: int,
           out=sys.stdout) -> tuple[int, str, dict | None]:
    """Collective: load the newest verifying checkpoint under ``args.checkpoint.load`` into ``parts``
    (optimizer state and published parameter shards; RNG state too when the layout is
    unchanged). Returns (iteration to continue from, how it was resumed, the data position
    it records: :data:`~odc_pp.training.data_position.DATA_KEYS`, None when it records
    none); (0, "", None) when there is none and that is allowed. ``--finetune``: the
    weights only, from iteration 0.
    A Megatron-LM torch_dist save directory is read by :mod:`.megatron_checkpoint`."""
    if _from_rank0(is_megatron_checkpoint(args.checkpoint.load) if topo.rank == 0 else None,
                   topo):
        return (*_overridden(args, *resume_from_megatron(parts, args, topo, out=out)), None)
    kind, found = _from_rank0(_candidates(args.checkpoint.load) if topo.rank == 0 else None, topo)
    if kind == "error":
        raise ValueError(found)
    if kind == "none":
        if args.checkpoint.finetune:
            raise ValueError(f"{found}: --finetune needs a checkpoint to start from")
        if not (args.checkpoint.load_optional or _same_dir(args.checkpoint.load, args.checkpoint.save)):
            raise ValueError(f"{found}; fix --load, or pass --load-optional to train from "
                             f"scratch when it holds no checkpoint")
        if topo.rank == 0:
            print(f"{found}: training from scratch", file=out, flush=True)
        return 0, "", None
    now = checkpoint_meta(args, topo, vocab_size=vocab_size)
    skipped: list[tuple[int, list[str]]] = []
    for iteration in found:
        directory = checkpoint_dir(args.checkpoint.load, iteration)
        status, message, payload = _read(parts, args, topo, directory, now)
        verdicts = _gather((status, message), topo)
        fatal = [m for s, m in verdicts if s == "fatal"]
        if fatal:
            raise ValueError(fatal[0])
        corrupt = list(dict.fromkeys(m for s, m in verdicts if s == "corrupt"))
        if corrupt:
            skipped.append((iteration, corrupt))
            continue
        state, saved, recorded, data = payload
        parts.optimizer.load_state_dict(state)
        parts.engine.finish_step()
        if message == "exact":
            set_rng_state(saved["rng"])
        if parts.loss_scaler is not None and saved and saved.get("loss_scaler"):
            # --fp16: the scale goes on where it was (a resharded resume starts it afresh)
            parts.loss_scaler.load_state_dict(saved["loss_scaler"])
        if skipped:
            _report_fallback(args, topo, iteration, skipped)
        if message == "finetune":
            return 0, f"finetuning: weights of iteration {iteration}, fresh optimizer " \
                      f"state", None
        return (*_overridden(args, recorded, message), data)
    problems = "; ".join(m for _, messages in skipped for m in messages)
    raise ValueError(f"no checkpoint under --load {args.checkpoint.load} verifies: {problems}")


def _data_record(meta: dict, saved: dict | None) -> dict | None:
    """The data position a checkpoint records: its meta.json's :data:`DATA_KEYS`; of one
    written before they were there, the consumed samples its rank file recorded with
    --rampup-batch-size (None when neither)."""
    if meta.get("consumed_samples") is not None:
        return {key: meta.get(key) for key in DATA_KEYS}
    if saved is not None and saved.get("consumed_samples") is not None:
        return {"consumed_samples": saved["consumed_samples"]}
    return None


def _overridden(args: TrainingArgs, recorded: int | None, how: str) -> tuple[int, str]:
    """(iteration to continue from, how): ``--override-resume-iteration`` or the recorded
    one."""
    override = args.checkpoint.override_resume_iteration
    if override is None:
        return recorded, how
    return override, f"{how}; iteration {override} by {OVERRIDE_FLAG}, the checkpoint " \
                     f"records {recorded}"


def _report_fallback(args: TrainingArgs, topo: Topology, iteration: int,
                     skipped: list[tuple[int, list[str]]]) -> None:
    """Warn about the checkpoints that failed verification; when --load is also --save,
    move them aside (``iter_N.corrupt``, kept for inspection) and point ``latest`` at the
    loaded one, so that this run may write those iterations again."""
    if topo.rank == 0:
        for bad, messages in skipped:
            for message in messages:
                print(f"warning: checkpoint iteration {bad} is unusable: {message}",
                      file=sys.stderr, flush=True)
        print(f"warning: falling back to iteration {iteration} "
              f"({checkpoint_dir(args.checkpoint.load, iteration)}), the newest checkpoint under --load "
              f"that verifies", file=sys.stderr, flush=True)
        if _same_dir(args.checkpoint.load, args.checkpoint.save):
            for bad, _ in skipped:
                source = checkpoint_dir(args.checkpoint.load, bad)
                target, suffix = source + ".corrupt", 1
                while os.path.exists(target):
                    target, suffix = f"{source}.corrupt.{suffix}", suffix + 1
                os.rename(source, target)
                print(f"warning: moved {source} aside to {target}", file=sys.stderr,
                      flush=True)
            fsync_dir(args.checkpoint.load)
            write_file_atomic(os.path.join(args.checkpoint.load, LATEST), f"{iteration}\n".encode())
    dist.barrier()
