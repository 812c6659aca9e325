"""The step loop: one optimizer step after another, with packing a step ahead, steps read back a step late, metrics,
evaluations and checkpoints at their steps.

StepLoop reads a LoopState, which training.recipe.FinetuneRecipe.setup() builds (the flags, the process, the
fast-path choices, the wrapped model and its optimizer, the loader, the metrics and heartbeat, and the recipe's
forward, evaluation and checkpoint), and run() returns a LoopResult. The loss of a step is normalised by the
supervised tokens of the whole step over all ranks (so accumulation and the number of processes do not change it).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.data.encoding import IGNORE_INDEX
from training.fast import allocator, apply, sequence_parallel
from training.fast.choice import FastChoice
from training.fast.fp8_watch import Fp8Watch
from training.flags import DataFlags, SaveFlags, TrainFlags
from training.runtime import dist, profiling, save_request, step_timing
from training.runtime.dist import DistEnv
from training.runtime.heartbeat import Heartbeat, NoHeartbeat
from training.runtime.metrics import MetricsWriter
from training.runtime.step_timing import StepTimer

log = logging.getLogger("training")


@dataclass
class StepLoss:
    """One micro-batch's forward: the loss backward runs on, and its parts for the metrics."""
    loss: torch.Tensor
    ce: torch.Tensor  # the cross-entropy part
    aux_sum: torch.Tensor | None = None  # mixture of experts: the load-balancing loss x real tokens (None without)
    pref_sums: torch.Tensor | None = None  # DPO: the pairs' reward sums (training.fast.preference.STATS)


@dataclass
class LoopState:
    """What the step loop reads, set up by the recipe: the flag groups it reads, and what set-up built."""
    train: TrainFlags
    save: SaveFlags
    data: DataFlags
    eval_strategy: str  # HF's --eval_strategy, as parsing resolved it
    env: DistEnv
    fast: FastChoice
    device: torch.device
    wrapped: torch.nn.Module  # what the forward goes through: the DeepSpeed engine, DDP, or the bare model
    engine: Any  # the DeepSpeed engine (None without --deepspeed)
    ddp: Any  # DistributedDataParallel (None on one process or under DeepSpeed)
    optimizer: Any
    scheduler: Any
    scaler: Any  # fp16's GradScaler (None without)
    trainable_params: list[torch.nn.Parameter]
    loader: Iterable
    pad_id: int
    meta_group: Any  # the packing thread's process group (several ranks, packing), else None
    timing_group: Any  # the logging gather's process group (several ranks), else None
    metrics: MetricsWriter
    heartbeat: Heartbeat | NoHeartbeat  # the phase the loop is in (training.runtime.heartbeat)
    timer: StepTimer  # each rank's compute and wait (training.runtime.step_timing)
    total_steps: int
    steps_per_epoch: int
    start_step: int  # 0, or the resumed checkpoint's step
    aux_loss: bool  # a mixture of experts whose load-balancing loss is logged
    forward_loss: Callable[[dict, torch.Tensor, torch.Tensor], StepLoss]  # (batch, num_items, num_tokens)
    evaluate: Callable[[int], float] | None  # at a step; None without evaluation data
    save_checkpoint: Callable[[int], None]  # at a step
    pairs: bool = False  # DPO: the loader yields preference pairs, and the loss is normalised by pairs, not tokens
    fp8: Fp8Watch | None = None  # FP8 on: its profiled step and its loss guard (training.fast.fp8_watch)


@dataclass
class LoopResult:
    """What a finished loop produced."""
    step: int  # the last optimizer step
    evaluated_step: int | None  # the step the last evaluation ran at (None: none ran)
    lazy_truncated: int  # with --lazy_preprocess: records truncated in training batches
    train_runtime: float  # seconds
    saved_and_stopped: bool = False  # a checkpoint asked for by SIGUSR2 was saved at `step`, and the loop ended


class StepLoop:
    def __init__(self, state: LoopState):
        self.state = state
        self.env, self.fast, self.device = state.env, state.fast, state.device
        self.train, self.save, self.data = state.train, state.save, state.data
        self.heartbeat, self.timer, self.metrics = state.heartbeat, state.timer, state.metrics
        self.step = state.start_step  # read by the recipe while the loop runs (a stop or a failure names it)
        self.evaluated_step: int | None = None
        self.lazy_truncated = 0
        self._retries_warned = 0  # allocator retries already warned about
        self._window = _Window()
        self._failing = False  # after a failure: no logging gather (the other ranks may be anywhere)
        # SIGUSR2 (training/runtime/save_request.py): this rank's flag rides the step's loss all-reduce; once any
        # rank's flag is in a step's sum, every rank saves and stops at the same step
        self._save_flag = torch.zeros((), dtype=torch.float64, device=self.device)
        self._flag_sent = False
        self.save_and_stop = False

    def run(self) -> LoopResult:
        gas = self.train.gradient_accumulation_steps
        self.state.wrapped.train()
        # The tokenized records, the model and the tokenizer are millions of long-lived Python objects; a full
        # garbage collection walks all of them, tens of milliseconds at an arbitrary step while the GPU waits.
        # Frozen, the collector skips them (what the loop itself allocates is still collected).
        gc.collect()
        gc.freeze()
        batches = iter(self.state.loader)
        # Packing runs one step ahead on a thread (the next step's job starts once this step's first micro-batch
        # is queued on the GPU), so the GPU does not wait for Python between steps.
        packer = ThreadPoolExecutor(1, thread_name_prefix="pack") if self.fast.packing else None

        def pack_next():
            return packer.submit(lambda: self._pack_cpu([e for _ in range(gas) for e in next(batches)]))

        pending = pack_next() if packer else None
        try:
            return self._train_loop(batches, pending, pack_next)
        finally:
            if packer:
                packer.shutdown(wait=True, cancel_futures=True)

    def _train_loop(self, batches, pending, pack_next) -> LoopResult:
        st = self.state
        env, hb, timer = self.env, self.heartbeat, self.timer
        gas = self.train.gradient_accumulation_steps
        hb.step = self.step
        t_start = time.perf_counter()
        queued = None  # with --overlap_steps: the last step, queued on the GPU and not yet read back
        try:
            while self.step < st.total_steps:
                profiled = self._profiled(self.step + 1)
                if queued is not None and profiled:
                    # Read back before the profiler starts: its start-up would count as the queued step's time.
                    self._record_step(queued, seconds=None)
                    queued = None
                prof = profiling.start(self.device) if profiled and env.is_main else None
                mark = profiling.marker(prof)
                t0 = time.perf_counter()
                now = self.step + 1  # the step under way
                hb.phase("data")
                with mark("step: inputs"):
                    if self.fast.packing:
                        packed, pending = pending.result(), None
                        # Waiting here is waiting for the others as far as the packing thread waited in its gather.
                        timer.add_host_wait(now, min(time.perf_counter() - t0, packed[3]))
                        micro, counts = self._packed_step(packed)
                    else:
                        micro = [{k: v.to(self.device, non_blocking=True) for k, v in next(batches).items()}
                                 for _ in range(gas)]
                        # Supervised and real tokens of the whole optimizer step, over all ranks: the loss divisor.
                        counts = torch.tensor([sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in micro),
                                               sum(int(b["attention_mask"].sum()) for b in micro),
                                               sum(int(b["truncated"]) for b in micro), 0], dtype=torch.float64)
                    if dist.active() and not self.fast.packing:  # packed steps come with all ranks' counts
                        hb.phase("collective")
                        started = timer.start()
                        counts = dist.all_reduce_sum(counts.to(self.device))
                        timer.end(now, started)
                        counts = counts.cpu()
                    n_labels, n_tokens, n_trunc, n_empty = counts.tolist()
                    # DDP and DeepSpeed average gradients over ranks; scaling by world size turns that into a sum.
                    num_items = self._device_scalar(max(n_labels, 1.0) / env.world_size)
                    loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
                    # the routers' load-balancing loss x real tokens, summed (mixture of experts; training.model.moe)
                    aux_sum = torch.zeros((), dtype=torch.float64, device=self.device)
                    pref_sum = None  # DPO: the pairs' reward sums
                    num_tokens = self._device_scalar(max(n_tokens, 1.0) / env.world_size)
                    lr = self._current_lr()
                for i, batch in enumerate(micro):
                    last = i == len(micro) - 1
                    if st.engine is not None and self.fast.packing:
                        # A packed step has as many rows as its records need (the same on every rank), not the
                        # configured accumulation count: the engine is told which one ends the step.
                        st.engine.set_gradient_accumulation_boundary(last)
                    sync = contextlib.nullcontext() if (last or st.ddp is None) else st.ddp.no_sync()
                    with sync:
                        hb.phase("forward")
                        # FP8's loss guard: the first micro-batch of an early step, with bf16 matmuls, first
                        ref = st.fp8.reference(now, batch, num_items, num_tokens) if st.fp8 and i == 0 else None
                        with mark("step: forward"):
                            out = st.forward_loss(batch, num_items, num_tokens)
                        if ref is not None:
                            st.fp8.check(now, ref, out)
                        hb.phase("backward")
                        if last:  # the micro-batch whose backward waits for every rank's gradients
                            timer.arm()
                        with mark("step: backward"):
                            self._backward(out.loss)
                        timer.disarm(now)
                    if pending is None and self.fast.packing and self.step + 1 < st.total_steps:
                        # The next step is packed from here on: with this micro-batch's kernels queued, the packing
                        # thread's Python runs while the main thread waits on the GPU. Started with the step, it
                        # held the GIL while the main thread had the first kernels to launch, and the GPU idled.
                        pending = pack_next()
                    if queued is not None:
                        # The previous step is read back only now, with this step's first micro-batch queued: the
                        # GPU works on it while the host waits, logs and writes metrics.
                        with mark("step: previous step's metrics"):
                            self._record_step(queued, seconds=t0 - queued.t0)
                        queued = None
                    if st.engine is not None:
                        if last:
                            hb.phase("optimizer")
                        st.engine.step()  # DeepSpeed counts micro-batches and updates on the last one
                    loss_sum += out.ce.detach().double() * num_items.double()
                    if out.aux_sum is not None:
                        aux_sum += out.aux_sum
                    if out.pref_sums is not None:
                        pref_sum = out.pref_sums.double() + (pref_sum if pref_sum is not None else 0.0)
                hb.phase("optimizer")
                with mark("step: optimizer"):
                    grad_norm = self._optimizer_step()
                self.step += 1
                hb.step = self.step
                hb.phase("collective")
                started = timer.start()
                if save_request.REQUEST.asked and not self._flag_sent:
                    self._save_flag.fill_(1.0)
                    self._flag_sent = True
                # the loss, the aux loss and a checkpoint asked for on any rank (then DPO's reward sums)
                sums = torch.stack([loss_sum, aux_sum, self._save_flag])
                if st.pairs:  # a rank with only empty rows has no reward sums: zeros, in the same collective
                    from training.fast.preference import STATS

                    pref = pref_sum if pref_sum is not None else torch.zeros(len(STATS), dtype=torch.float64,
                                                                             device=self.device)
                    sums = torch.cat([sums, pref])
                loss_sum = dist.all_reduce_sum(sums)  # one collective for all
                timer.end(self.step, started)
                done = _Queued(self.step, loss_sum, grad_norm, lr, n_labels, n_tokens, n_trunc, n_empty, len(micro), t0)
                due_eval = st.evaluate is not None and self._eval_due()
                # Decided alike on every rank (the profiled step is main's only): the logging gather of a queued
                # step comes a step later, and all ranks must meet it at the same point.
                if (self.fast.overlap_steps and not self._profiled(self.step) and self.step < st.total_steps
                        and not due_eval and not self._should_save() and not self.save_and_stop):
                    queued = done
                    continue
                self._record_step(done, seconds=None)  # reads the step back: waits for the GPU
                if prof is not None:
                    self._profile_done(prof, t0, len(micro))
                if due_eval:
                    st.evaluate(self.step)
                    self.evaluated_step = self.step  # the run's end need not evaluate the same weights again
                if self._should_save() or self.save_and_stop:
                    st.save_checkpoint(self.step)
                if self.save_and_stop:
                    log.warning("checkpoint of step %d saved as asked (SIGUSR2: the job's time is nearly up); "
                                "training stops here, to resume from it", self.step)
                    return LoopResult(self.step, self.evaluated_step, self.lazy_truncated,
                                      time.perf_counter() - t_start, saved_and_stopped=True)
        except BaseException:
            if queued is not None:  # a step that finished before the failure still gets its metrics record
                self._flush_after_error(queued)
            raise
        return LoopResult(self.step, self.evaluated_step, self.lazy_truncated, time.perf_counter() - t_start)

    def _record_step(self, q: "_Queued", seconds: float | None) -> None:
        """Reads a finished step's loss and gradient norm back and logs it (every --logging_steps). seconds: the
        step's share of the wall time, or None to take it from the step's start until now, after the read-back."""
        loss_sum, aux_sum, asked, *pref = q.loss_sum.tolist()
        if asked > 0:  # read back at the same point on every rank: they all stop after the same step
            self.save_and_stop = True
        grad_norm = float(q.grad_norm)
        if seconds is None:
            seconds = time.perf_counter() - q.t0
        if q.n_trunc and self.data.lazy_preprocess:
            self.lazy_truncated += int(q.n_trunc)
            if self.env.is_main:
                log.warning("step %d: %d record(s) longer than --model_max_length %d were truncated",
                            q.step, int(q.n_trunc), self.data.model_max_length)
        w = self._window
        w.add(loss_sum, q.n_labels, q.n_tokens, seconds)
        w.wait += self.timer.take(q.step)
        w.aux_sum += aux_sum
        w.micro_batches += q.micro_batches
        w.empty_rows += int(q.n_empty)
        if pref:
            w.pref = [a + b for a, b in zip(w.pref, pref)] if w.pref else pref
        if q.step % self.save.logging_steps == 0 or q.step == self.state.total_steps:
            self._log_step(w, q.step, q.lr, grad_norm)
            self._window = _Window()

    def _flush_after_error(self, q: "_Queued") -> None:
        self._failing = True
        try:
            self._record_step(q, seconds=None)
        except Exception as e:  # the device may be what failed; the original error is what gets raised
            log.warning("step %d's metrics could not be read back after the failure: %s", q.step, e)

    def _device_scalar(self, x: float) -> torch.Tensor:
        """A float32 scalar on the device without a synchronisation: a copy from pageable memory would wait for
        every queued kernel, so on CUDA it goes through pinned memory."""
        t = torch.tensor(x, dtype=torch.float32)
        if self.device.type != "cuda":
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    def _pack_cpu(self, items: list) -> tuple[list[dict], list[float], int, float]:
        """The CPU half of a packed step (runs on the packing thread): this rank's rows, pinned on CUDA; the
        supervised tokens, real tokens, truncated records and empty rows of all ranks; the rows every rank
        runs (the busiest rank's count); and the seconds spent in the gather. Several ranks agree on these here,
        on the host, a step ahead."""
        f, max_length = self.fast, self.data.model_max_length
        pad_id = self.state.pad_id
        if self.state.pairs:  # DPO: pairs, each kept in one row; the loss is a mean over pairs
            from training.fast.preference import pack_pairs

            rows = pack_pairs(items, f.packing_tokens, pad_id, self._pad_multiple, max_length)
            counts = [float(len(items)), float(sum(p.tokens for p in items)), float(sum(p.truncated for p in items))]
        else:
            rows = apply.pack_step(items, f.packing_tokens, pad_id, self._pad_multiple, max_length)
            rows = [sequence_parallel.local(r) for r in rows]  # this rank's share of every row under SP
            counts = [float(sum(sum(1 for x in e.labels[1:] if x != IGNORE_INDEX) for e in items)),
                      float(sum(len(e.input_ids) for e in items)), float(sum(int(e.truncated) for e in items))]
        if self.device.type == "cuda":
            rows = [{k: (v.pin_memory() if isinstance(v, torch.Tensor) else v) for k, v in r.items()} for r in rows]
        if self.state.meta_group is None:
            return rows, counts + [0.0], len(rows), 0.0
        started = time.perf_counter()
        ranks = dist.gather_floats(counts + [float(len(rows))], self.state.meta_group)
        gather_s = time.perf_counter() - started
        most = int(max(r[3] for r in ranks))
        # The ranks of a sequence-parallel group ran the same records: each is counted once.
        totals = [sum(r[i] for r in ranks) / sequence_parallel.size() for i in range(3)]
        return rows, totals + [most * len(ranks) - sum(r[3] for r in ranks)], most, gather_s

    @property
    def _pad_multiple(self) -> int:
        # Rows are as wide as their records rounded up to this: tile-friendly widths on CUDA with at most 127 tokens
        # of padding a row (the compiled layers are shape-dynamic, so widths cost no recompiles).
        return sequence_parallel.pad_multiple(128 if self.device.type == "cuda" else 8)

    def _packed_step(self, packed: tuple[list[dict], list[float], int, float]) -> tuple[list[dict], torch.Tensor]:
        """A step's packed rows on the device, as many as the busiest rank has (the others get empty rows: DDP
        needs the same number of forwards everywhere), with the counts of all ranks (see _pack_cpu)."""
        f, max_length = self.fast, self.data.model_max_length
        rows, counts, n_rows, _ = packed
        if len(rows) < n_rows:
            if self.state.pairs:  # a row of no pairs: the same modules run as on a row of pairs (ZeRO-3)
                from training.fast.preference import empty_pair_row

                filler = empty_pair_row(min(self._pad_multiple, f.packing_tokens), self.state.pad_id, max_length)
            else:
                filler = sequence_parallel.local(apply.empty_row(min(self._pad_multiple, f.packing_tokens),
                                                                 self.state.pad_id, max_length))
            rows = rows + [filler] * (n_rows - len(rows))
        micro = [{k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in r.items()}
                 for r in rows]
        return micro, torch.tensor(counts, dtype=torch.float64)

    def _profiled(self, step: int) -> bool:
        """Whether `step` runs under the profiler: --profile_step, or FP8's proof (the same on every rank; the
        profiler itself runs on the main process)."""
        fp8 = self.state.fp8
        return self.save.profile_step == step or (fp8 is not None and fp8.profile_step == step)

    def _profile_done(self, prof, t0: float, micro_batches: int) -> None:
        """The profiled step's ends: --profile_step's table (and trace), FP8's count of its FP8 matmuls."""
        if self.save.profile_step == self.step:
            out = Path(self.train.output_dir) / f"profile-step{self.step}.txt"
            trace = out.with_suffix(".json.gz") if self.save.profile_trace else None
            text = profiling.finish(prof, self.device, out, time.perf_counter() - t0, trace=trace)
            log.info("profile of step %d (%s):\n%s", self.step, out, text)
        else:
            profiling.stop(prof, self.device)
        fp8 = self.state.fp8
        if fp8 is not None and fp8.profile_step == self.step:
            fp8.profiled(self.step, prof, micro_batches)

    def _current_lr(self) -> float:
        return float(self.state.scheduler.get_last_lr()[0])

    def _backward(self, loss: torch.Tensor) -> None:
        st = self.state
        if st.engine is not None:
            st.engine.backward(loss, scale_wrt_gas=False)  # our loss is already normalised per step
        elif st.scaler is not None:
            st.scaler.scale(loss).backward()
        else:
            loss.backward()

    def _optimizer_step(self) -> torch.Tensor | float:
        st = self.state
        if st.engine is not None:
            norm = st.engine.get_global_grad_norm()  # engine.step() already ran with the last micro-batch
            return float(norm) if norm is not None else float("nan")
        if st.scaler is not None:
            st.scaler.unscale_(st.optimizer)
        max_norm = self.train.max_grad_norm if self.train.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(st.trainable_params, max_norm)
        if st.scaler is not None:
            st.scaler.step(st.optimizer)
            st.scaler.update()
        else:
            st.optimizer.step()
        st.scheduler.step()
        st.optimizer.zero_grad(set_to_none=True)
        return norm  # on the device: _record_step reads it back (with --overlap_steps, a step later)

    def _log_step(self, w: "_Window", step: int, lr: float, grad_norm: float) -> None:
        rec = {
            "step": step,
            "epoch": round(step / self.state.steps_per_epoch, 4),
            "loss": w.loss_sum / max(w.labels, 1.0),
            "learning_rate": lr,
            "grad_norm": grad_norm,
            "tokens": int(w.tokens),
            "label_tokens": int(w.labels),
            "tokens_per_second": w.tokens / w.seconds if w.seconds > 0 else None,
            "step_time": w.seconds / w.steps,
        }
        rec.update(self._rank_times(w, rec["step_time"]))
        if self.state.pairs:  # DPO: the loss is the pairs' mean; rewards and log-probabilities are means a pair
            from training.fast.preference import STATS

            pairs = max(w.labels, 1.0)
            rec["pairs"] = int(w.labels)
            del rec["label_tokens"]  # no token count: the loss divides by pairs
            rec.update({k: v / pairs for k, v in zip(STATS, w.pref or [0.0] * len(STATS))})
            rec["rewards_margin"] = rec["rewards_chosen"] - rec["rewards_rejected"]
        if self.state.aux_loss:
            # the load-balancing loss per real token (the objective adds router_aux_loss_coef x this to the loss)
            rec["aux_loss"] = w.aux_sum / max(w.tokens, 1.0)
        if self.fast.packing:
            rec["micro_batches"] = w.micro_batches  # packed rows each process ran, empty ones included
            rec["empty_rows"] = w.empty_rows  # rows of padding, over all processes, so all ran as many
        if self.device.type == "cuda":
            rec["peak_memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            # Each retry freed the allocator's cache mid-step: a device-wide synchronisation (training.fast.allocator).
            rec["alloc_retries"] = allocator.retries(self.device)
            if rec["alloc_retries"] > self._retries_warned:
                log.warning("the CUDA allocator freed its cache and retried %d time(s) so far (each one stalls the "
                            "GPU): %s", rec["alloc_retries"],
                            "lower --auto_memory_fraction" if self.fast.expandable_segments
                            else "use --expandable_segments or a lower --auto_memory_fraction")
                self._retries_warned = rec["alloc_retries"]
        self.metrics.write(rec)
        log.info("step %d/%d loss %.4f lr %.3g grad_norm %.3f %.0f tok/s", step, self.state.total_steps,
                 rec["loss"], lr, grad_norm, rec["tokens_per_second"] or 0.0)

    def _rank_times(self, w: "_Window", step_time: float) -> dict:
        """rank_compute_s, rank_wait_s, rank_node of every rank (training.runtime.step_timing): one small gather on the
        host, on every rank at the same logged step. Left out of a record written after a failure."""
        wait = w.wait / w.steps
        compute = max(step_time - wait, 0.0)
        self.heartbeat.figures(compute, wait, step_time)
        mine = [compute, wait, float(self.env.node_rank)]
        if self._failing:
            return {}
        if self.state.timing_group is None:
            return step_timing.per_rank([mine])
        left = self.heartbeat.phase("collective")
        gathered = dist.gather_floats(mine, self.state.timing_group)
        self.heartbeat.restore(left)
        return step_timing.per_rank(gathered)

    def _eval_due(self) -> bool:
        """--eval_strategy steps: every --eval_steps; epoch: at the last step of every epoch (as HF Trainer)."""
        if self.state.eval_strategy == "epoch":
            return self.step % self.state.steps_per_epoch == 0
        return self.save.eval_steps > 0 and self.step % self.save.eval_steps == 0

    def _should_save(self) -> bool:
        save = self.save
        if save.save_strategy == "steps":
            return self.step % save.save_steps == 0
        if save.save_strategy == "epoch":
            return self.step % self.state.steps_per_epoch == 0
        return False


@dataclass
class _Queued:
    """A finished optimizer step whose loss and gradient norm may still be on the device."""
    step: int
    # [summed token loss, summed aux loss x real tokens, ranks asking a checkpoint, DPO's reward sums...], summed
    loss_sum: torch.Tensor
    grad_norm: torch.Tensor | float
    lr: float
    n_labels: float
    n_tokens: float
    n_trunc: float
    n_empty: float
    micro_batches: int
    t0: float


class _Window:
    """Sums over the optimizer steps between two metrics records."""

    def __init__(self):
        self.loss_sum = self.labels = self.tokens = self.seconds = self.wait = self.aux_sum = 0.0
        self.steps = self.micro_batches = self.empty_rows = 0
        self.pref: list[float] | None = None  # DPO: the reward sums (training.fast.preference.STATS)

    def add(self, loss_sum: float, labels: float, tokens: float, seconds: float) -> None:
        self.loss_sum += loss_sum
        self.labels += labels
        self.tokens += tokens
        self.seconds += seconds
        self.steps += 1

