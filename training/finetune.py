"""Entry point of the worker that torchrun starts on every node.

    # one process (CPU or one GPU)
    python -m training.finetune --model_name_or_path builtin:tiny --data_path builtin:demo-chat \\
        --output_dir runs/demo --use_lora --max_steps 40 --learning_rate 2e-3

    # two nodes x 8 GPUs, LoRA with DeepSpeed ZeRO-2
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m training.finetune --model_name_or_path Qwen/Qwen2.5-7B-Instruct --data_path chat.jsonl \\
        --output_dir out --bf16 --use_lora --deepspeed training/ds_config_zero2.json

`--help` lists every flag. Exit codes: 0 trained and saved; 2 bad input or
configuration (one line on stderr naming the file, record or flag; nothing
written to the output directory); SIGTERM stops it quietly with one line, "stopped by
request at step N" (exit 0 under torchrun, see training/runtime/stop.py); 1 anything else (the traceback is on stderr,
or one `error:` line where the worker explains the failure itself, as FP8's loss guard does under --fp8 on; and
metrics.jsonl gets an {"event": "end", "status": "error"} record).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback

from training.args import parse_args
from training.flags import Resolved
from training.runtime import heartbeat, save_request, stacks
from training.runtime.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, ExplainedFailure, InputError
from training.runtime.stop import PEER_STOP_WAIT_S, StopRequested, StopSignal, let_peer_agents_check_out, peer_gone

log = logging.getLogger("training")


def _setup_logging() -> None:
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    from training.runtime import quiet

    quiet.install()  # library messages that say nothing about the run (training/runtime/quiet.py)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "warning")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # avoids fork warnings with loader workers


def main(argv: list[str] | None = None) -> int:
    _setup_logging()
    # SIGTERM is a quiet stop with one line, not a traceback (training/runtime/stop.py), from the first moment: a stop
    # while torch is still being imported would otherwise kill the rank, and its torchrun agent would report
    # a failed child with a traceback. Noted until the imports are done (arm() below), then raised.
    stop = StopSignal()
    previous = stop.install()
    save_request.REQUEST.install()  # SIGUSR2: a checkpoint, then a quiet stop (its default would end the rank)
    held: dict = {}  # the recipe, once it exists: the step a stop came at
    try:
        code = _run(argv, stop, held)
    except StopRequested:  # while the recipe tidied up, after it had handled its own
        recipe = held.get("recipe")
        log.warning("%s", stop.line(recipe.step if recipe is not None and recipe.started else None))
        code = stop.exit_code()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if stop.requested:
        # node 0's agent leaves the exit barrier last, so the others see it (training/runtime/stop.py); on node 0's
        # first rank this process becomes the waiter and does not come back
        let_peer_agents_check_out(code)
    return code


def _run(argv: list[str] | None, stop: StopSignal, held: dict) -> int:
    try:
        args = parse_args(argv)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from training.runtime import quiet, unused_imports

    quiet.cpu_run(bool(args.train.use_cpu))
    unused_imports.refuse_bitsandbytes_unless(args.lora.q_lora)  # before peft or transformers can import it
    unused_imports.refuse_mlflow_unless(args.hf.report_to)  # before deepspeed can import it
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        for line in args.notes.hf_warnings:  # HF flags accepted from a copied command that change nothing here
            log.warning("%s", line)
    # `kill -USR1 PID` writes every thread's stack (to the log, or DIR/stack-rank-N.txt with --heartbeat_dir) and
    # the run carries on: where a hung rank waits. Both start before torch is imported, so a rank that hangs in
    # its set-up is seen too.
    dumps = stacks.register(args.save.heartbeat_dir, rank)
    beat = heartbeat.from_flags(args.save, tick=dumps.check if dumps is not None else None)
    try:
        return _train(args, stop, held, beat)
    finally:
        beat.close()  # stops the thread after one last write (phase done after a finished run)


def _train(args, stop: StopSignal, held: dict, beat) -> int:
    from training.fast.allocator import configure

    resolved = Resolved.of(args)  # what set-up decides of the flags, beside them (the flags stay as given)
    try:  # the allocator reads its settings once, when torch starts CUDA: before torch is imported
        resolved.expandable_segments, resolved.expandable_why = configure(args.fast.expandable_segments)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT

    from training.data import token_cache
    from training.recipe import FinetuneRecipe  # imports torch: only after the flags are known to be fine

    token_cache.configure(args.data.tokenized_cache_dir, args.data.tokenize_timeout)

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading bars would flood every node's log
    recipe = held["recipe"] = FinetuneRecipe(args, resolved, heartbeat=beat)
    try:
        stop.arm()  # a stop that came during the imports ends here
        recipe.setup()
        trained = recipe.train()
        if trained.saved_and_stopped:
            return _saved_and_stopped(recipe)
        recipe.save_final()
        if recipe.eval_ds is not None and trained.evaluated_step != trained.step:
            recipe.evaluate(trained.step)
        recipe.finish()
        beat.done()
        return EXIT_OK
    except Exception as e:
        if not stop.requested and peer_gone(e):  # a peer's stop can end our collective before our own signal
            stop.await_stop(PEER_STOP_WAIT_S)
        if stop.requested:  # whatever unwound (the signal, or a collective whose peer stopped first) is the stop
            return _stopped(recipe, stop)
        if isinstance(e, InputError):
            print(f"error: {e}", file=sys.stderr)
            recipe.fail(e)
            return EXIT_BAD_INPUT
        if isinstance(e, ExplainedFailure):  # the worker's own verdict, in full: no traceback
            print(f"error: {e}", file=sys.stderr)
            recipe.fail(e)
            return EXIT_FAILED
        traceback.print_exc()  # report, record in metrics.jsonl, and exit non-zero
        recipe.fail(e)
        return EXIT_FAILED
    except KeyboardInterrupt as e:  # report, record in metrics.jsonl, and exit non-zero
        traceback.print_exc()
        recipe.fail(e)
        return EXIT_FAILED
    finally:
        recipe.cleanup()


def _stopped(recipe, stop: StopSignal) -> int:
    """A requested stop: one line in the log, the end record says stopped, no traceback."""
    log.warning("%s", stop.line(recipe.step if recipe.started else None))
    if recipe.started and recipe.metrics is not None:
        recipe.metrics.write({"event": "end", "status": "stopped", "step": recipe.step})
    return stop.exit_code()


def _saved_and_stopped(recipe) -> int:
    """SIGUSR2's checkpoint is saved: the end record says stopped, at that step, and why."""
    if recipe.metrics is not None:
        recipe.metrics.write({"event": "end", "status": "stopped", "step": recipe.step,
                              "reason": "checkpoint saved as asked (SIGUSR2), to resume from it"})
    return EXIT_OK


def _exit_now(code: int) -> None:
    """Ends the process without the interpreter's teardown. By now every file is closed and the process group
    destroyed. In teardown, torch.distributed's C++ objects (Gloo's work queue and the tensors it still holds)
    are destroyed in no set order and can abort a run that succeeded. The CI log shows it: "terminate called
    without an active exception", SIGABRT, exit -6 after the final save. torchrun then reports the node failed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
