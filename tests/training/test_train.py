"""The worker trains the tiny model for real, in one process, over DDP and over DeepSpeed ZeRO-2/3.

Runs are module fixtures shared by the tests that assert on them. The strongest
checks compare runs with each other: with the same global batch, a 2-process
DDP or ZeRO run must reproduce the single-process loss curve step by step (the
gradients really are averaged over ranks, accumulation is normalised right),
and a resumed run must reproduce the uninterrupted one.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest

from support.worker import assert_ok, demo_records, eval_loss_of, run_worker, write_jsonl

pytestmark = pytest.mark.slow

STEP_FIELDS = {"step", "epoch", "loss", "learning_rate", "grad_norm", "tokens", "tokens_per_second", "step_time", "time"}


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model):
    d = tmp_path_factory.mktemp("data")
    recs = demo_records()
    openai = [{"id": r["id"], "messages": [{"role": t["from"], "content": t["value"]} for t in r["conversations"]]}
              for r in recs]
    return {
        "model": str(tiny_model),
        "train": str(write_jsonl(d / "train.jsonl", recs)),
        "train_openai": str(write_jsonl(d / "train_openai.jsonl", openai)),
        "eval": str(write_jsonl(d / "eval.jsonl", recs[-48:])),
    }


def common(files, *extra):
    return ["--model_name_or_path", files["model"], "--eval_data_path", files["eval"], "--model_max_length", "128",
            "--logging_steps", "1", "--seed", "7", *extra]


# Full fine-tuning, global batch 8, 12 steps: the reference curve for the ZeRO runs.
FULL = ["--learning_rate", "1e-3", "--max_steps", "12", "--save_strategy", "no", "--warmup_ratio", "0.1"]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, files):
    run = run_worker(tmp_path_factory.mktemp("full") / "out", *common(files, *FULL), "--data_path", files["train_openai"],
                     "--lazy_preprocess", "--per_device_train_batch_size", "8", "--profile_step", "5")
    assert_ok(run)
    return run


def over_128_tokens(files) -> int:
    from transformers import AutoTokenizer

    from training.data.encoding import ChatEncoder
    from training.data.records import load_conversations

    enc = ChatEncoder(AutoTokenizer.from_pretrained(files["model"]), 10_000)
    return sum(len(enc.encode(c).input_ids) > 128 for c in load_conversations(files["train"]))


def falls(losses: list[float], by: float) -> bool:
    return sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - by


def test_full_fine_tuning_one_process_loss_falls(full_run):
    losses = [r["loss"] for r in full_run.steps]
    assert len(losses) == 12 and falls(losses, 1.0), losses
    assert (full_run.out / "model.safetensors").is_file() and (full_run.out / "config.json").is_file()


def test_profile_step_writes_the_step_kernels(full_run):
    profiles = sorted(p.name for p in full_run.out.glob("profile-step*"))
    assert profiles == ["profile-step5.txt"]  # that step only, no temporary file left
    table = (full_run.out / "profile-step5.txt").read_text()
    assert "Self CPU time total" in table and "aten::mm" in table  # the step's matmuls, forward and backward


def test_metrics_jsonl_records(full_run):
    lines = (full_run.out / "metrics.jsonl").read_text().splitlines()
    recs = full_run.records  # every line parses on its own
    assert len(recs) == len(lines)
    start, end = recs[0], recs[-1]
    assert start["event"] == "start" and start["world_size"] == 1 and start["method"] == "full"
    assert start["zero_stage"] == 0 and start["total_steps"] == 12 and isinstance(start["time"], float)
    assert end["event"] == "end" and end["status"] == "ok" and end["step"] == 12
    assert isinstance(end["truncated_records"], int)  # lazy: counted as batches meet them
    steps = full_run.steps
    assert [r["step"] for r in steps] == list(range(1, 13))
    for r in steps:
        assert STEP_FIELDS <= r.keys(), r
        assert 0 < r["tokens"] and r["label_tokens"] < r["tokens"] <= 8 * 128
        assert r["tokens_per_second"] > 0 and r["step_time"] > 0 and math.isfinite(r["grad_norm"])
        assert "peak_memory_gib" not in r  # no GPU here
        # One process waits for nobody: its whole step is compute.
        assert r["rank_compute_s"] == [r["step_time"]] and r["rank_wait_s"] == [0.0] and r["rank_node"] == [0], r
    assert steps[0]["learning_rate"] < steps[1]["learning_rate"]  # warm-up
    assert steps[-1]["epoch"] == pytest.approx(12 / 50)
    times = [r["time"] for r in recs]
    assert times == sorted(times)
    (ev,) = full_run.event("eval")
    assert ev["step"] == 12 and ev["eval_tokens"] > 0


def test_full_model_reloads_with_the_same_loss(full_run, files):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(full_run.out)
    tok = AutoTokenizer.from_pretrained(full_run.out)
    (ev,) = full_run.event("eval")
    assert eval_loss_of(model, tok, files["eval"], 128) == pytest.approx(ev["eval_loss"], abs=1e-5)


@pytest.mark.parametrize("config,batch,extra,loss,packing", [
    ("zero2", ["2", "2"], [], "chunked", True),  # the default under ZeRO-1/2: packed rows, the fused loss
    # the fused loss on padded micro-batches, with the optimizer offloaded to the host (ZeRO-Offload)
    ("zero2_offload_optimizer", ["4", "1"], ["--no_packing"], "chunked", False),
    ("zero2", ["4", "1"], ["--no_packing", "--fused_ce", "off"], "hf", False),  # transformers' loss
    ("zero3", ["2", "2"], [], "chunked", True),  # the default under ZeRO-3 too: the head gathered for our loss
    ("zero3_offload_optimizer", ["4", "1"], ["--no_packing"], "chunked", False),
], ids=["zero2-packed", "zero2-padded-offload", "zero2-hf", "zero3-packed", "zero3-padded-offload"])
# (transformers' loss under ZeRO-3 too reached no path of ours these miss, for 25 CPU-seconds)
def test_deepspeed_two_processes_matches_one_process(tmp_path, files, full_run, config, batch, extra, loss, packing):
    """ZeRO-2 and ZeRO-3 over 2 processes with the same global batch of 8 reproduce the plain single-process curve:
    packed rows with the fused (chunked) loss, and padded micro-batches with either loss, the optimizer offloaded
    to the host (ZeRO-Offload) or not. Under ZeRO-3 the LM head's partitioned weight is gathered for our loss (the
    tiny model ties it to the embedding)."""
    run = run_worker(tmp_path / "out", *common(files, *FULL), "--data_path", files["train"], "--deepspeed",
                     f"builtin:{config}", "--per_device_train_batch_size", batch[0],
                     "--gradient_accumulation_steps", batch[1], *extra, nproc=2)
    assert_ok(run)
    # DeepSpeed's CPU shared-memory op (inference only) was neither built nor loaded (training.runtime.unused_imports)
    assert "shm_comm" not in run.stdout + run.stderr
    assert "is deprecated" not in run.stderr  # torch's warnings on ZeRO's collectives, dozens a step (training.runtime.quiet)
    start = run.records[0]
    stage = int(config.split("_")[0][-1])
    assert start["world_size"] == 2 and start["zero_stage"] == stage and start["global_batch_size"] == 8
    if "offload" in config:  # stepped on the host by the worker's own AdamW: no C++ op was compiled for it
        assert "cpu_adam" not in run.stdout + run.stderr, run.stderr[-3000:]
    assert start["fast_path"]["ce"] == loss and start["fast_path"]["packing"] is packing
    if packing:  # steps of one row, not the 2 configured micro-batches: the engine's step ends with the rows
        assert any(r["micro_batches"] == 1 for r in run.steps), [r["micro_batches"] for r in run.steps]
    # Records over --model_max_length are counted in the start record and logged, not silently cut.
    assert start["truncated_records"] == over_128_tokens(files) > 0
    assert f"{start['truncated_records']} record(s) longer than --model_max_length 128 were truncated" in run.stderr
    ref, got = full_run.steps, run.steps
    assert [r["step"] for r in got] == [r["step"] for r in ref]
    for a, b in zip(got, ref):
        # Adam hides a wrongly scaled gradient from the loss curve, not from the gradient norm.
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3), (a, b)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3), (a, b)
        assert a["tokens"] == b["tokens"] and a["label_tokens"] == b["label_tokens"]
    # The saved model (consolidated from the shards under ZeRO-3) reloads with the loss measured at save time.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    (ev,) = run.event("eval")
    model = AutoModelForCausalLM.from_pretrained(run.out)
    tok = AutoTokenizer.from_pretrained(run.out)
    assert eval_loss_of(model, tok, files["eval"], 128) == pytest.approx(ev["eval_loss"], abs=1e-4)


@pytest.mark.parametrize("config", ["zero2", "zero3"])
def test_compiled_layers_and_fused_adamw_under_deepspeed_keep_the_curve(tmp_path, files, full_run, monkeypatch,
                                                                        config):
    """torch.compile of the decoder layers under ZeRO-2 (the whole layer call) and ZeRO-3 (each layer one leaf
    module, gathered by DeepSpeed's eager hooks around its compiled forward), with fused AdamW as the engine's client
    optimizer, over 2 processes keeps the single-process curve. Dynamo and AOTAutograd trace the layers as on a GPU;
    aot_eager skips building C++."""
    monkeypatch.setenv("TRAINING_COMPILE_BACKEND", "aot_eager")
    run = run_worker(tmp_path / "out", *common(files, *FULL), "--data_path", files["train"], "--deepspeed",
                     f"builtin:{config}", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
                     "--compile", "--fused_adamw", nproc=2)
    assert_ok(run)
    fp = run.records[0]["fast_path"]
    assert fp["compile"] is True and fp["fused_adamw"] is True and fp["packing"] is True and fp["ce"] == "chunked"
    for a, b in zip(run.steps, full_run.steps, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3), (a, b)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3), (a, b)


LORA_NO_DROP = ["--use_lora", "--lora_r", "16", "--lora_alpha", "32", "--lora_dropout", "0", "--learning_rate", "3e-3",
                "--max_steps", "8", "--save_strategy", "no"]


def test_zero3_lora_two_processes_matches_one_process(tmp_path, files):
    """LoRA under ZeRO-3 (frozen, partitioned base; packed rows, our loss) over 2 processes reproduces the plain
    single-process curve. The frozen embedding gives the first layer inputs without gradients; without
    enable_input_require_grads DeepSpeed released that layer's weights before its backward used them."""
    one = run_worker(tmp_path / "one", *common(files, *LORA_NO_DROP), "--data_path", files["train"],
                     "--per_device_train_batch_size", "8")
    assert_ok(one)
    two = run_worker(tmp_path / "two", *common(files, *LORA_NO_DROP), "--data_path", files["train"],
                     "--deepspeed", "builtin:zero3", "--per_device_train_batch_size", "4", nproc=2)
    assert_ok(two)
    assert two.records[0]["fast_path"]["packing"] is True and two.records[0]["zero_stage"] == 3
    for a, b in zip(two.steps, one.steps, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3), (a, b)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=2e-3), (a, b)
    assert falls([r["loss"] for r in two.steps], 0.02)


def test_zero3_lora_adapters_train_in_the_configs_16_bit_dtype_as_under_zero2(tmp_path, files):
    """Under ZeRO-3 the base is partitioned while it loads, and DeepSpeed then casts no parameter to the config's
    dtype: LoRA adapters added after loading trained in fp32 (fp32 dropout copies saved, fp32 adapter matmuls;
    0.65x plain DDP on an H200). The worker casts them as the engine does under ZeRO-2, so with --bf16 both stages
    train the same bf16 adapters and follow the same curve."""
    runs = {}
    for stage in ("zero2", "zero3"):
        runs[stage] = run_worker(tmp_path / stage, *common(files, *LORA_NO_DROP), "--data_path", files["train"],
                                 "--deepspeed", f"builtin:{stage}", "--per_device_train_batch_size", "8", "--bf16")
        assert_ok(runs[stage])
    assert "parameters added after loading (the adapters) cast to bfloat16" in runs["zero3"].stderr
    assert "cast to bfloat16" not in runs["zero2"].stderr  # the engine casts them itself there
    for a, b in zip(runs["zero3"].steps, runs["zero2"].steps, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=2e-3), (a, b)
    assert falls([r["loss"] for r in runs["zero3"].steps], 0.02)


def test_zero3_save_on_each_node_writes_the_model_on_every_node(tmp_path, files):
    """Two nodes without shared storage (two torchrun agents, one process each, each its own output directory):
    with --save_on_each_node both get the consolidated ZeRO-3 model, the same weights, and it reloads with the
    loss measured at save time."""
    import os
    import subprocess
    import sys

    from support.paths import ROOT
    from support.ports import free_port

    port = free_port()
    flags = common(files, "--learning_rate", "1e-3", "--max_steps", "4", "--save_strategy", "no",
                   "--data_path", files["train"], "--deepspeed", "builtin:zero3", "--per_device_train_batch_size", "4",
                   "--save_on_each_node")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    outs = [tmp_path / f"node{n}" for n in (0, 1)]
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(n),
                               "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
                               "-m", "training.finetune", "--output_dir", str(outs[n]), *flags],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in (0, 1)]
    results = []
    try:
        for p in procs:
            results.append(p.communicate(timeout=420))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-4000:]
    from safetensors.torch import load_file

    weights = [load_file(str(o / "model.safetensors")) for o in outs]
    assert weights[0].keys() == weights[1].keys() and len(weights[0]) > 10
    assert all(torch_equal(weights[0][k], weights[1][k]) for k in weights[0])
    recs = [__import__("json").loads(x) for x in (outs[0] / "metrics.jsonl").read_text().splitlines()]
    assert recs[0]["world_size"] == 2 and recs[0]["zero_stage"] == 3
    (ev,) = [r for r in recs if r.get("event") == "eval"]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(outs[1])  # the node that used to get no model
    tok = AutoTokenizer.from_pretrained(outs[1])
    assert eval_loss_of(model, tok, files["eval"], 128) == pytest.approx(ev["eval_loss"], abs=1e-4)


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


# LoRA, 18 steps, a checkpoint every 6, keep 2; dropout on, so resuming must restore the RNG too.
LORA = ["--use_lora", "--lora_r", "16", "--lora_alpha", "32", "--lora_dropout", "0.1", "--learning_rate", "3e-3",
        "--max_steps", "18", "--save_steps", "6", "--save_total_limit", "2", "--per_device_train_batch_size", "8"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, files):
    run = run_worker(tmp_path_factory.mktemp("lora") / "out", *common(files, *LORA), "--data_path", files["train"],
                     "--merge_lora")
    assert_ok(run)
    return run


def test_lora_one_process_loss_falls_and_checkpoints_rotate(lora_run):
    losses = [r["loss"] for r in lora_run.steps]
    assert len(losses) == 18 and falls(losses, 1.0), losses
    assert lora_run.records[0]["method"] == "lora"
    assert sorted(p.name for p in lora_run.out.glob("checkpoint-*")) == ["checkpoint-12", "checkpoint-18"]
    assert [r["step"] for r in lora_run.event("checkpoint")] == [6, 12, 18]
    assert not list(lora_run.out.glob("*.tmp"))
    assert (lora_run.out / "adapter_model.safetensors").is_file() and (lora_run.out / "adapter_config.json").is_file()
    assert (lora_run.out / "checkpoint-12" / "finetune_state.json").is_file()  # not HF's trainer_state.json
    manifest = json.loads((lora_run.out / "checkpoint-12" / "manifest.json").read_text())
    assert manifest["step"] == 12 and manifest["world_size"] == 1 and manifest["ranks"] == [0]
    assert manifest["files"]["adapter_model.safetensors"] == (lora_run.out / "checkpoint-12" /
                                                              "adapter_model.safetensors").stat().st_size


def test_resume_continues_step_count_and_loss_curve(tmp_path, files, lora_run):
    """`auto` resumes from the newest whole checkpoint: newer ones left incomplete (a file truncated by a full disk,
    the manifest never written) are skipped, each named with why."""
    out = tmp_path / "out"
    out.mkdir()
    shutil.copytree(lora_run.out / "checkpoint-12", out / "checkpoint-12")
    shutil.copytree(lora_run.out / "checkpoint-18", out / "checkpoint-18")
    with open(out / "checkpoint-18" / "adapter_model.safetensors", "r+b") as f:
        f.truncate(100)
    shutil.copytree(lora_run.out / "checkpoint-18", out / "checkpoint-16")
    (out / "checkpoint-16" / "manifest.json").unlink()
    run = run_worker(out, *common(files, *LORA), "--data_path", files["train"], "--resume_from_checkpoint", "auto")
    assert_ok(run)
    skipped = [ln for ln in run.stderr.splitlines() if "is skipped: incomplete" in ln]
    assert any("checkpoint-18 is skipped: incomplete, adapter_model.safetensors is 100 bytes" in ln
               for ln in skipped), run.stderr[-3000:]
    assert any("checkpoint-16 is skipped: incomplete, no manifest.json" in ln for ln in skipped), skipped
    start = run.records[0]
    assert start["start_step"] == 12 and start["resumed_from"].endswith("checkpoint-12")
    ref, got = lora_run.losses(), run.losses()
    assert sorted(got) == list(range(13, 19))
    for step in got:
        assert got[step] == pytest.approx(ref[step], rel=1e-5), (step, got, ref)
    lr_ref = {r["step"]: r["learning_rate"] for r in lora_run.steps}
    assert all(r["learning_rate"] == pytest.approx(lr_ref[r["step"]]) for r in run.steps)
    assert run.event("eval")[0]["eval_loss"] == pytest.approx(lora_run.event("eval")[0]["eval_loss"], rel=1e-5)


def test_saved_adapter_and_merged_model_reload_with_the_same_loss(files, lora_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    (ev,) = lora_run.event("eval")
    tok = AutoTokenizer.from_pretrained(lora_run.out)
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(files["model"]), lora_run.out)
    assert eval_loss_of(adapted, tok, files["eval"], 128) == pytest.approx(ev["eval_loss"], abs=1e-5)
    base = eval_loss_of(AutoModelForCausalLM.from_pretrained(files["model"]), tok, files["eval"], 128)
    assert base > ev["eval_loss"] + 1.0  # the adapter is what carries the learning
    merged = AutoModelForCausalLM.from_pretrained(lora_run.out / "merged")
    assert eval_loss_of(merged, tok, files["eval"], 128) == pytest.approx(ev["eval_loss"], abs=1e-4)


def test_lora_over_torchrun_ddp_two_processes(tmp_path, files):
    """Real DDP: 2 ranks x 4 records give the same curve as 1 process x 8, and the replicas end identical."""
    flags = [*common(files, "--use_lora", "--lora_r", "16", "--lora_alpha", "32", "--lora_dropout", "0",
                     "--learning_rate", "3e-3", "--max_steps", "10", "--save_strategy", "no"),
             "--data_path", files["train"]]
    ddp = run_worker(tmp_path / "ddp", *flags, "--per_device_train_batch_size", "4", nproc=2)
    assert_ok(ddp)
    single = run_worker(tmp_path / "single", *flags, "--per_device_train_batch_size", "8")
    assert_ok(single)
    assert ddp.records[0]["world_size"] == 2
    end = ddp.records[-1]
    assert len(end["replica_checksums"]) == 2 and end["replicas_in_sync"] is True
    ref, got = single.steps, ddp.steps
    assert [r["step"] for r in got] == list(range(1, 11))
    for a, b in zip(got, ref):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), (a, b)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), (a, b)
        assert a["tokens"] == b["tokens"]
    assert falls([r["loss"] for r in got], 0.5), got


def test_qlora_one_process(tmp_path, files):
    run = run_worker(tmp_path / "out", "--model_name_or_path", files["model"], "--data_path", files["train"],
                     "--q_lora", "--lora_r", "16", "--lora_alpha", "32", "--learning_rate", "5e-3", "--max_steps", "8",
                     "--per_device_train_batch_size", "4", "--model_max_length", "96", "--logging_steps", "1",
                     "--save_strategy", "no", "--seed", "7")
    assert_ok(run)
    assert run.records[0]["method"] == "qlora"
    losses = [r["loss"] for r in run.steps]
    assert len(losses) == 8 and falls(losses, 0.5), losses
    assert (run.out / "adapter_model.safetensors").is_file()


QLORA_NO_DROP = ["--q_lora", "--lora_r", "16", "--lora_alpha", "32", "--lora_dropout", "0", "--learning_rate", "5e-3",
                 "--max_steps", "6", "--model_max_length", "96", "--logging_steps", "1", "--save_strategy", "no",
                 "--seed", "7"]


def test_qlora_base_sharded_over_four_zero3_ranks(tmp_path, files):
    """Q-LoRA under ZeRO-3 over 4 processes: the nf4 base (stored in the compute dtype) is partitioned, each rank
    holding about a quarter of it, and training follows the single-process Q-LoRA curve (same global batch of 8,
    no dropout, so the two runs see the same numbers up to the order of sums)."""
    one = run_worker(tmp_path / "one", "--model_name_or_path", files["model"], "--data_path", files["train"],
                     *QLORA_NO_DROP, "--per_device_train_batch_size", "8")
    assert_ok(one)
    four = run_worker(tmp_path / "four", "--model_name_or_path", files["model"], "--data_path", files["train"],
                      *QLORA_NO_DROP, "--per_device_train_batch_size", "2", "--deepspeed", "builtin:zero3", nproc=4,
                      timeout=600)
    assert_ok(four)
    start = four.records[0]
    assert start["method"] == "qlora" and start["zero_stage"] == 3 and start["world_size"] == 4
    part = start["base_partition"]
    assert len(part["held_by_rank"]) == 4 and part["total"] > 0
    for held in part["held_by_rank"]:
        assert 0.2 < held / part["total"] < 0.3, part  # a quarter, give or take each partition's padding
    for a, b in zip(four.steps, one.steps, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=2e-3), (a, b)
    assert falls([r["loss"] for r in four.steps], 0.3)


def test_sigterm_stops_the_worker_quietly_with_a_stopped_record(tmp_path, files):
    """SIGTERM (qwen-tui's stop-all, torchrun passing one on) stops the worker quietly: one line
    "stopped by request at step N" and no traceback; the monitor gets a closing record that says
    stopped. Without torchrun it exits as a process killed by SIGTERM would (128 + 15)."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from support.paths import ROOT

    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "training.finetune", "--output_dir", str(out), "--model_name_or_path", files["model"],
           "--data_path", files["train"], "--max_steps", "100000", "--save_strategy", "no", "--logging_steps", "1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        metrics = out / "metrics.jsonl"
        while not (metrics.is_file() and '"step"' in metrics.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "no training step within 120 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "stopped by request at step " in err.strip().splitlines()[-1], err[-3000:]
    last = json.loads(metrics.read_text().splitlines()[-1])
    assert last["event"] == "end" and last["status"] == "stopped" and last["step"] >= 1, last


def test_deepspeed_resume_without_torchrun(tmp_path, files):
    """ZeRO-2 in a plain `python -m` process; its checkpoint resumes the same curve through DeepSpeed's loader."""
    flags = [*common(files, "--use_lora", "--learning_rate", "3e-3", "--max_steps", "4", "--save_steps", "2"),
             "--data_path", files["train"], "--deepspeed", "builtin:zero2", "--per_device_train_batch_size", "4"]
    first = run_worker(tmp_path / "first", *flags)
    assert_ok(first)
    assert (first.out / "checkpoint-2" / "ds").is_dir()
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copytree(first.out / "checkpoint-2", out / "checkpoint-2")
    resumed = run_worker(out, *flags, "--resume_from_checkpoint", str(out / "checkpoint-2"))
    assert_ok(resumed)
    ref, got = first.losses(), resumed.losses()
    assert sorted(got) == [3, 4] and all(got[s] == pytest.approx(ref[s], rel=1e-5) for s in got), (got, ref)
