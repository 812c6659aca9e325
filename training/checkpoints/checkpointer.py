"""Checkpoints and the final save: what a run writes, and what a resumed run reads back.

A checkpoint is staged in checkpoint-N.tmp and published with one rename (training.checkpoints.directories), so a
crash mid-save leaves the last complete one. It holds the model (or adapter) in Hugging Face format, the optimizer and
scheduler (or DeepSpeed's own state), every rank's RNG state and finetune_state.json. Under ZeRO-3 the model's weights
are gathered one module at a time on every rank, so with --save_on_each_node every node's first process writes them.
A DeepSpeed checkpoint resumed on another number of processes is loaded through checkpoint-N/universal
(training.checkpoints.universal), converted from it once.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from training.checkpoints import directories as ckpt
from training.checkpoints import manifest, universal
from training.flags import TrainFlags
from training.model.pretrained import merge_adapter, save_pretrained_here
from training.runtime import dist
from training.runtime.errors import InputError

log = logging.getLogger("training")


class Checkpointer:
    """Writes and reads one run's checkpoints. model: the bare model (what the engine or DDP wraps); train: its
    flags (output_dir, the precision, the collectives' timeout); on_each_node: --save_on_each_node as set-up
    resolved it."""

    def __init__(self, env, stage: int, method: str, model, tokenizer, source: str, *, train: TrainFlags,
                 save_total_limit: int | None, merge_lora: bool, on_each_node: bool):
        self.env, self.stage, self.method = env, stage, method
        self.model, self.tokenizer, self.source = model, tokenizer, source
        self.train, self.save_total_limit, self.merge_lora = train, save_total_limit, merge_lora
        self.on_each_node = on_each_node

    @property
    def is_saver(self) -> bool:
        """The process that writes shared files: rank 0, or each node's first process with --save_on_each_node."""
        return self.env.local_rank == 0 if self.on_each_node else self.env.is_main

    # ------------------------------------------------------------------ the model
    def save_model(self, out: Path, for_resume: bool) -> None:
        """Writes the model (or the LoRA adapter) and tokenizer in HF format: as it trains for a checkpoint to
        resume from (`for_resume`), else in its export dtype. Collective under ZeRO-3."""
        if self.stage == 3:
            state_dict = self._gather_zero3_state_dict(trainable_only=self.method != "full")
            if self.is_saver:
                save_pretrained_here(self.model, out, for_resume=for_resume, state_dict=state_dict)
                self.tokenizer.save_pretrained(out)
        elif self.is_saver:
            save_pretrained_here(self.model, out, for_resume=for_resume)
            self.tokenizer.save_pretrained(out)

    def _gather_zero3_state_dict(self, trainable_only: bool) -> dict | None:
        """The full weights of a ZeRO-3 model (only the trainable ones for LoRA), gathered one module at a time on
        every rank; the savers keep a CPU copy (the others get None). DeepSpeed's own consolidation hands them to
        global rank 0 alone, so with --save_on_each_node the other nodes would have had no model to write."""
        import deepspeed

        keep = self.is_saver
        state, copies = {}, {}
        for prefix, module in self.model.named_modules():
            params = [(n, p) for n, p in module.named_parameters(recurse=False) if p.requires_grad or not trainable_only]
            if params:
                with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None):
                    for n, p in params:
                        if keep:  # a tied weight is one tensor under both names, as save_pretrained expects
                            if id(p) not in copies:
                                copies[id(p)] = p.data.detach().to("cpu", copy=True)
                            state[f"{prefix}.{n}" if prefix else n] = copies[id(p)]
            if keep and not trainable_only:
                for n, b in module.named_buffers(recurse=False):
                    if b is not None and n not in module._non_persistent_buffers_set:
                        state[f"{prefix}.{n}" if prefix else n] = b.detach().to("cpu", copy=True)
        return state if keep else None

    # ------------------------------------------------------------ checkpoints
    def save_checkpoint(self, step: int, state: dict, engine=None, optimizer=None, scheduler=None,
                        scaler=None) -> Path:
        """checkpoint-STEP with the training state (engine's, or optimizer + scheduler + scaler) and `state`
        (finetune_state.json: step, batch, method, ...). Collective; returns the published directory."""
        env = self.env
        tmp, final = ckpt.staging_dir(self.train.output_dir, step)
        if self.is_saver:
            ckpt.clear(tmp)  # left over from a run that died mid-save
            tmp.mkdir(parents=True)
        dist.barrier()
        tmp.mkdir(parents=True, exist_ok=True)  # a rank on a node without shared storage
        if engine is not None:
            engine.save_checkpoint(str(tmp), tag="ds", exclude_frozen_parameters=self.method != "full")
        elif self.is_saver:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            if scaler is not None:
                torch.save(scaler.state_dict(), tmp / "scaler.pt")
        torch.save(rng_state(), tmp / f"rng_state_{env.rank}.pth")
        self.save_model(tmp, for_resume=True)
        if self.is_saver:
            ckpt.write_json(tmp / ckpt.STATE_FILE, {**state, "time": time.time()})
        dist.barrier()
        if self.is_saver:
            # every rank has written its part: the manifest, last, makes the checkpoint whole (manifest.py)
            manifest.write(tmp, step, env.world_size, self._parts_here())
            ckpt.publish(tmp, final)
            for gone in ckpt.rotate(self.train.output_dir, self.save_total_limit, state.get("lineage")):
                log.info("deleted %s (--save_total_limit %d)", gone, self.save_total_limit)
        dist.barrier()
        log.info("saved %s", final)
        return final

    def _parts_here(self) -> range:
        """The ranks whose parts this saver's copy holds: every rank, or with --save_on_each_node this node's."""
        env = self.env
        if not self.on_each_node:
            return range(env.world_size)
        first = env.rank - env.local_rank
        return range(first, first + env.local_world_size)

    def load_training_state(self, d: Path, device, engine=None, optimizer=None, scheduler=None, scaler=None,
                            step: int = 0) -> None:
        """Restores optimizer, scheduler and (for DeepSpeed) weights; model weights of plain runs came with the
        model (training.builders.build_model)."""
        if engine is not None:
            path = self._load_engine_state(d, engine, device)
            if path is None:
                raise InputError(f"{d}: no DeepSpeed state in the checkpoint (was it written without --deepspeed?)")
        else:
            if not (d / "optimizer.pt").is_file():
                raise InputError(f"{d}: no optimizer.pt (was it written with --deepspeed?)")
            optimizer.load_state_dict(torch.load(d / "optimizer.pt", map_location=device, weights_only=True))
            scheduler.load_state_dict(torch.load(d / "scheduler.pt", weights_only=True))
            if scaler is not None and (d / "scaler.pt").is_file():
                scaler.load_state_dict(torch.load(d / "scaler.pt", weights_only=True))
        rng = d / f"rng_state_{self.env.rank}.pth"
        if rng.is_file():
            set_rng_state(torch.load(rng, weights_only=False))
        else:
            log.warning("%s: no RNG state for rank %d; dropout will not repeat exactly", d, self.env.rank)
        log.info("resumed from %s at step %d", d, step)

    def _load_engine_state(self, d: Path, engine, device):
        """DeepSpeed's own state: as saved when the world size is the same, else through the universal format
        (training.checkpoints.universal), whose slices any world size can load. Returns the loaded path (None: none
        there)."""
        saved = universal.saved_world_size(d, ckpt.read_state(d))
        if saved is None or saved == self.env.world_size or self.stage == 0:
            path, _ = engine.load_checkpoint(str(d), tag=universal.SAVED_TAG, load_module_strict=self.method == "full")
            return path
        log.info("%s was saved by %d processes, resuming on %d: through DeepSpeed's universal checkpoint",
                 d, saved, self.env.world_size)
        universal.ensure(d, saved, self.is_saver, self.train.ddp_timeout, device)
        # The engine reads the switch from its config on every load; it is set for this load only (the
        # config dict it was built from is the lead's training.dsconfig, and its own saves stay per-rank).
        base = getattr(engine.optimizer, "optimizer", None)  # the torch optimizer inside ZeRO's
        decay = [g.get("weight_decay") for g in base.param_groups] if base is not None else []
        engine._config.load_universal_checkpoint = True
        try:
            # Universal loads restore the trainable weights from the fp32 slices, not from the module state
            # (a LoRA checkpoint excludes the frozen base, which the model already holds from its source).
            path, _ = engine.load_checkpoint(str(d), tag=universal.TAG)
        finally:
            engine._config.load_universal_checkpoint = False
        if self.stage == 3 and base is not None:
            _repair_zero3_universal_load(base, decay)
        return path

    # ------------------------------------------------------------ the final save
    def save_final(self) -> None:
        """The trained model (or adapter) into output_dir, plus output_dir/merged with --merge_lora."""
        t = self.train
        out = Path(t.output_dir)
        tmp = out / ".final.tmp"
        if self.is_saver:
            ckpt.clear(tmp)
            tmp.mkdir(parents=True)
        dist.barrier()
        self.save_model(tmp, for_resume=False)
        dist.barrier()
        if self.is_saver:
            ckpt.move_contents(tmp, out)
            if self.merge_lora:
                merged_tmp, merged = out / ".merged.tmp", out / "merged"
                ckpt.clear(merged_tmp)
                dtype = torch.bfloat16 if t.bf16 else torch.float16 if t.fp16 else torch.float32
                merge_adapter(self.source, str(out), str(merged_tmp), dtype, self.tokenizer)
                ckpt.clear(merged)
                os.rename(merged_tmp, merged)
                log.info("saved the merged model in %s", merged)
        dist.barrier()
        log.info("saved the final %s in %s", "adapter" if self.method != "full" else "model", out)


def _repair_zero3_universal_load(optimizer, decay: list) -> None:
    """Undoes two slips of DeepSpeed 0.19's ZeRO-3 universal load (stage3.load_hp_checkpoint_state_from_
    checkpoint_dir_stage3): it gives every parameter group's state one and the same `step` tensor, which each
    group's Adam step then increments (2 groups: the bias correction ran twice as fast, and the resumed losses
    drifted from the uninterrupted run's by the second step), and it copies the first group's hyperparameters
    onto every group (biases and norms got the matrices' weight decay)."""
    seen = set()
    for state in optimizer.state.values():
        step = state.get("step")
        if torch.is_tensor(step):
            if id(step) in seen:
                state["step"] = step.clone()
            seen.add(id(step))
    for group, wd in zip(optimizer.param_groups, decay):
        if wd is not None:
            group["weight_decay"] = wd


def rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
