"""FP8 against bf16 through the worker itself: `python -m training.finetune --fp8 off` against `--fp8 on`, same
model, data and seed, on one GPU, in one device call of at most 10 minutes; one table and a JSON file.

    python bench/fp8_worker.py --out DIR                 # on one H100/H200: the three cases that fit --budget-s
    python bench/fp8_worker.py --cases lora-7b --out DIR
    python bench/fp8_worker.py --cpu-smoke --out /tmp/s  # every code path on the tiny shape, on the CPU

bench/fp8_speed.py measured torchao's float8 against bf16 in a plain training loop (7B LoRA 1.26x, 7B full 1.25x,
1.5B full 1.03x on an H200: bench/results/fp8_speed-2026-12-05-H200.md). This runs the worker's own fast path:
packed rows, Liger's fused loss on supervised positions, compiled layers, fused AdamW, overlapped steps, with
--fp8 and its proof (the fp8, fp8_profile and fp8_guard records of metrics.jsonl). Cases, in this order:

  lora-7b        Qwen2.5-7B's shape (all 28 layers), LoRA r=64 alpha=16 dropout 0.05 on every projection, plain
                 DDP in one process; 8 records of 1,024 tokens a step in rows of 4,096 (two micro-batches)
  full-7b-zero3  the 7B layer shape, full fine-tuning under DeepSpeed ZeRO-3 (torchrun, one process): 12 of its 28
                 layers, since one GPU holds ZeRO-3's ~18 bytes a trained parameter for 2.8 B of them beside the
                 activations on an H100 as on an H200 (28 layers need about 120 GiB of states alone); 4 records a
                 step in one row of 4,096
  full-1.5b      Qwen2.5-1.5B's shape (28 layers), full fine-tuning without DeepSpeed (fp32 weights, bf16
                 autocast); 8 records a step in one row of 8,192

and, when named in --cases, the same shapes in rows the worker sizes itself (no --packing_tokens: its memory probe
picks the longest row the GPU holds, as a user's run gets by default), with more records a step:

  lora-7b-rows       lora-7b with 16 records a step
  full-1.5b-rows     full-1.5b with 32 records a step
  full-7b-zero3-rows full-7b-zero3 with 8 records a step
  lora-7b-zero2-rows lora-7b-rows under DeepSpeed ZeRO-2 (torchrun, one process): qwen-tui's default strategy
  lora-7b-ckpt-rows  lora-7b-rows with --gradient_checkpointing (the probe's rows are then longer than a step's
                     16 records: one row a step)

Every model is random-init (--random_init) with the tiny built-in tokenizer's vocabulary (1,024): the embedding
and the LM head, which stay bf16 under FP8, are then negligible, so the ratio is the decoder's (the real vocabulary's
LM head would add about 8% of a 7B step in bf16 to both arms, and pull the ratio down a little). The data: chat
records of exactly 1,024 tokens whose answer repeats a 16-word motif the question gives (the loss falls as the model
learns to copy), the same file for both arms. Each arm runs 50 steps: steps 1-10 are the warm-up (the compile, the
profiled step 2, FP8's loss guard over steps 1-8) and tokens/s counts steps 11-50 from metrics.jsonl. Once step
50's record is written the bench stops the worker (SIGTERM: it stops quietly) rather than wait for the final save.

Per case: tokens/s of each arm and their ratio; the loss at steps 1, 25 and 50 of each and the largest relative
difference over all 50 (parity: within 2%, as bench/fp8_speed.py holds); the linears converted and skipped; the
FP8 matmuls (aten::_scaled_mm) and FP8 GEMM kernels of the profiled step; the guard's largest difference; peak
memory; what `--fp8 auto` decides for the case on this GPU (training.fast.fp8.decide) and whether that agrees with
the measurement (auto on exactly where FP8 pays: 1.05x or more with parity and FP8 seen). A failed arm is reported
with its log's tail and the next case runs; a case the budget cannot hold is skipped, saying so.

The call (device tool; the branch's code travels as an ignored copy, since a call sends the lead's checkout):

    # here, in /work/main, once the branch exists (the wheels: .whl-lite holds DeepSpeed, Liger, pydantic...;
    # .whl-fp8 torchao 0.17.0):
    rm -rf .gpu-fp8w && mkdir .gpu-fp8w && git archive fp8-worker training bench | tar -x -C .gpu-fp8w \\
        && rm -rf .gpu-fp8w/bench/results && (grep -qx '/.gpu-fp8w/' .git/info/exclude || echo /.gpu-fp8w/ >> .git/info/exclude)
    # run: kind left out (one H100 or H200), carry [".whl-lite", ".whl-fp8", ".gpu-fp8w"], timeout_s 600, command:
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \\
        .whl-lite/*.whl .whl-fp8/*.whl && export PYTHONPATH=/tmp/site:$PWD/.gpu-fp8w PYTHONUNBUFFERED=1 \\
        && cd .gpu-fp8w && python3 bench/fp8_worker.py --out $OUT

--cpu-smoke runs the three cases on the tiny shape on the CPU (6 steps, compiled by aot_eager), FP8's arm on torch's
CPU _scaled_mm (TRAINING_FP8_ON_CPU=1), and exits non-zero unless both arms of every case ran, the FP8 arms proved
FP8 ran, and the table and JSON were written.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))

from fp8_speed import PARITY_LIMIT, PAYS_AT, verdict  # noqa: E402  (bench/ is not a package)
from train_speed import SHAPES  # noqa: E402

VOCAB = 1024  # the tiny built-in tokenizer's (training.model.tiny.VOCAB_SIZE)
MOTIF = 16
GUARD_STEPS = 8
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

# shape, method, ZeRO stage, layers (None: the shape's), records a step, record length, packed row (None: the
# worker's memory probe sizes it), learning rate, rough seconds of both arms on one H100 (for the budget)
CASES = {
    "lora-7b": dict(shape="7b", method="lora", zero=None, layers=None, records=8, seq=1024, row=4096, lr=5e-4,
                    est_s=190),
    "full-7b-zero3": dict(shape="7b", method="full", zero=3, layers=12, records=4, seq=1024, row=4096, lr=2e-5,
                          est_s=160),
    "full-1.5b": dict(shape="1.5b", method="full", zero=None, layers=None, records=8, seq=1024, row=8192, lr=1e-4,
                      est_s=110),
    "lora-7b-rows": dict(shape="7b", method="lora", zero=None, layers=None, records=16, seq=1024, row=None, lr=5e-4,
                         est_s=360),
    "full-1.5b-rows": dict(shape="1.5b", method="full", zero=None, layers=None, records=32, seq=1024, row=None,
                           lr=1e-4, est_s=200),
    "full-7b-zero3-rows": dict(shape="7b", method="full", zero=3, layers=12, records=8, seq=1024, row=None, lr=2e-5,
                               est_s=260),
    "lora-7b-zero2-rows": dict(shape="7b", method="lora", zero=2, layers=None, records=16, seq=1024, row=None,
                               lr=5e-4, est_s=380),
    "lora-7b-ckpt-rows": dict(shape="7b", method="lora", zero=None, layers=None, records=16, seq=1024, row=None,
                              lr=5e-4, est_s=250, ckpt=True),
    "full-7b-zero3-ckpt-rows": dict(shape="7b", method="full", zero=3, layers=12, records=8, seq=1024, row=None,
                                    lr=2e-5, est_s=240, ckpt=True),
}
DEFAULT_CASES = ("lora-7b", "full-7b-zero3", "full-1.5b")
SMOKE_CASES = {
    "lora-tiny": dict(shape="tiny", method="lora", zero=None, layers=None, records=4, seq=64, row=128, lr=2e-3,
                      est_s=60),
    "full-tiny-zero3": dict(shape="tiny", method="full", zero=3, layers=None, records=4, seq=64, row=256, lr=2e-3,
                            est_s=90),
    "full-tiny": dict(shape="tiny", method="full", zero=None, layers=None, records=4, seq=64, row=256, lr=2e-3,
                      est_s=60),
}
STEPS, WARMUP = 50, 10
# The device call is cut at CALL_S; the wheels' install comes first (about INSTALL_S), and an arm cut at the budget
# gets STOP_WAIT_S to stop quietly, then KILL_WAIT_S after a kill.
CALL_S, INSTALL_S, BUDGET_S, STOP_WAIT_S, KILL_WAIT_S = 600, 20, 500, 30, 15
SMOKE_STEPS, SMOKE_WARMUP, SMOKE_GUARD = 6, 3, 3
# The plain loop's ratios (bench/results/fp8_speed-2026-12-05-H200.md), printed beside the worker's.
LOOP_RATIOS = {"lora-7b": 1.257, "full-7b-zero3": 1.253, "full-1.5b": 1.035}
LOOP_RATIOS.update({f"{k}-rows": v for k, v in LOOP_RATIOS.items()})
LOOP_RATIOS["lora-7b-zero2-rows"] = LOOP_RATIOS["lora-7b"]


# ------------------------------------------------------------------ inputs


def model_config(case: dict) -> dict:
    cfg = dict(SHAPES[case["shape"]], vocab_size=VOCAB)
    if case["layers"]:
        cfg["num_hidden_layers"] = case["layers"]
    return cfg


def write_model(tmp: Path, name: str, case: dict) -> Path:
    """The case's model directory: its config.json (random weights are built by the worker) and the tiny tokenizer."""
    from transformers import Qwen2Config

    from training.model.tiny import build_tiny

    tiny = build_tiny(tmp / "tiny")
    d = tmp / f"model-{name}"
    d.mkdir(parents=True, exist_ok=True)
    for f in tiny.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors", "generation_config.json"):
            (d / f.name).write_bytes(f.read_bytes())
    cfg = Qwen2Config(**model_config(case), use_cache=False)
    cfg.architectures = ["Qwen2ForCausalLM"]
    cfg.dtype = "bfloat16"
    cfg.save_pretrained(d)
    return d


def write_data(path: Path, model_dir: Path, n: int, length: int, seed: int = 0) -> list[int]:
    """n chat records of exactly `length` tokens: the user gives a motif of single-token words, the answer repeats
    it; returns the records' token lengths."""
    from transformers import AutoTokenizer

    from training.data.encoding import ChatEncoder
    from training.data.records import Conversation

    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = ChatEncoder(tok, 10**6)
    words = sorted({w[1:] for w in (tok.convert_tokens_to_string([t]) for t in tok.get_vocab())
                    if w.startswith(" ") and w[1:].isalpha() and len(tok(w, add_special_tokens=False)["input_ids"]) == 1})
    if len(words) < 2 * MOTIF:
        raise RuntimeError(f"the tokenizer has only {len(words)} single-token words")
    rng = random.Random(seed)

    def tokens(user: str, answer: str) -> int:
        conv = Conversation(index=0, id="x", messages=[{"role": "user", "content": user},
                                                        {"role": "assistant", "content": answer}])
        return len(enc.encode(conv).input_ids)

    lens = []
    with open(path, "w") as out:
        for i in range(n):
            motif = [rng.choice(words) for _ in range(MOTIF)]
            user = "Repeat: " + " ".join(motif)
            k = max(1, length - tokens(user, motif[0]) + 1)
            for _ in range(4):  # a word pair can merge across the markup: correct by the difference
                answer = " ".join(motif[j % MOTIF] for j in range(k))
                got = tokens(user, answer)
                if got == length:
                    break
                k = max(1, k - (got - length))
            lens.append(got)
            out.write(json.dumps({"id": f"m{i}", "messages": [{"role": "user", "content": user},
                                                               {"role": "assistant", "content": answer}]}) + "\n")
    return lens


# ------------------------------------------------------------------ one arm


def worker_cmd(case: dict, model_dir: Path, data: Path, out: Path, fp8: str, steps: int, tok_cache: Path,
               smoke: bool) -> list[str]:
    cmd = ["-m", "training.finetune", "--model_name_or_path", str(model_dir), "--random_init", "--data_path", str(data),
           "--output_dir", str(out), "--max_steps", str(steps), "--per_device_train_batch_size", str(case["records"]),
           "--gradient_accumulation_steps", "1", "--model_max_length", str(case["seq"]),
           "--learning_rate", str(case["lr"]), "--lr_scheduler_type", "constant",
           "--weight_decay", "0.0", "--save_strategy", "no", "--logging_steps", "1", "--seed", "42", "--bf16",
           "--tokenized_cache_dir", str(tok_cache), "--fp8", fp8,
           "--fp8_guard_steps", str(SMOKE_GUARD if smoke else GUARD_STEPS)]
    if case["row"]:
        cmd += ["--packing_tokens", str(case["row"])]
    if case["method"] == "lora":
        cmd += ["--use_lora", "--lora_r", "64", "--lora_alpha", "16", "--lora_dropout", "0.05"]
    if case["zero"]:
        cmd += ["--deepspeed", f"builtin:zero{case['zero']}"]
    if case.get("ckpt"):
        cmd += ["--gradient_checkpointing"]
    if smoke:
        cmd += ["--compile"]  # traced by aot_eager (TRAINING_COMPILE_BACKEND), as the GPU compiles with Inductor
    launcher = [sys.executable]
    if case["zero"]:  # DeepSpeed runs under torchrun, one process here
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    return launcher + cmd


def read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line still being written
    return out


def run_arm(name: str, arm: str, cmd: list[str], out: Path, steps: int, warmup: int, deadline: float, env: dict,
            log) -> dict:
    """Runs one arm; stops it once step `steps` is recorded; its figures from metrics.jsonl."""
    t0 = time.monotonic()
    log.write(f"===== {name} {arm}: {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    metrics, why = out / "metrics.jsonl", None
    while True:
        rc = proc.poll()
        recs = read_metrics(metrics)
        done = any(r.get("step") == steps and "event" not in r for r in recs)
        if rc is not None:
            break
        if done:
            why = "stopped after its last step (no final save)"
            break
        if time.monotonic() > deadline:
            why = "cut: past the budget"
            break
        time.sleep(0.5)
    if proc.poll() is None:
        ended = any(r.get("event") == "end" for r in read_metrics(metrics))
        if not ended:  # a quiet stop (training/runtime/stop.py); to the group: torchrun's agent too
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=KILL_WAIT_S)
    wall = time.monotonic() - t0
    recs = read_metrics(metrics)
    res = {"arm": arm, "wall_s": round(wall, 1), "rc": proc.returncode, "stop": why}
    res.update(summarise(recs, steps, warmup))
    cut_by_budget(res, steps)
    log.flush()
    res["probes"] = probe_lines(log.name, name, arm)
    if res["status"] != "ok":
        log.flush()
        res["log_tail"] = tail_of(log.name, name, arm)
    return res


def cut_by_budget(res: dict, steps: int) -> None:
    """An arm the budget's end stopped short is "cut", not "failed": the worker did nothing wrong."""
    if res["status"] != "ok" and (res.get("stop") or "").startswith("cut"):
        res.update(status="cut", error=f"cut at the budget after {res['steps_recorded']} of {steps} steps")


def _arm_lines(log_path: str, name: str, arm: str) -> list[str]:
    lines = Path(log_path).read_text(errors="replace").splitlines()
    start = max((i for i, ln in enumerate(lines) if ln.startswith(f"===== {name} {arm}:")), default=0)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("===== ")), len(lines))
    return lines[start:end]  # up to the next arm's header


def tail_of(log_path: str, name: str, arm: str, n: int = 25) -> list[str]:
    return [ln[:300] for ln in _arm_lines(log_path, name, arm)[-n:]]


def probe_lines(log_path: str, name: str, arm: str) -> list[str]:
    """The worker's memory probe as it logged it (the peaks it measured, the rows it planned): what the rows cases
    show of the sizing."""
    return [ln[ln.index("auto micro-batch"):][:400] for ln in _arm_lines(log_path, name, arm)
            if "auto micro-batch" in ln]


def summarise(recs: list[dict], steps: int, warmup: int) -> dict:
    """An arm's figures from its metrics records."""
    step_recs = {r["step"]: r for r in recs if "event" not in r and "step" in r}
    start = next((r for r in recs if r.get("event") == "start"), {})
    end = next((r for r in recs if r.get("event") == "end"), {})
    ev = {k: [r for r in recs if r.get("event") == k] for k in ("fp8", "fp8_profile", "fp8_guard", "warning")}
    fast = start.get("fast_path", {})
    out: dict = {"steps_recorded": len(step_recs), "fast_path_fp8": fast.get("fp8"),
                 "fp8_why": fast.get("why", {}).get("fp8"), "packing_tokens": fast.get("packing_tokens"),
                 "gradient_checkpointing": fast.get("gradient_checkpointing")}
    if len(step_recs) < steps:
        out["status"] = "failed"
        out["error"] = end.get("error") or f"{len(step_recs)} of {steps} steps recorded"
        return out
    timed = [step_recs[s] for s in range(warmup + 1, steps + 1)]
    tokens = sum(r["tokens"] for r in timed)
    secs = sum(r["step_time"] for r in timed)
    losses = [step_recs[s]["loss"] for s in range(1, steps + 1)]
    out.update(status="ok", tokens_per_s=round(tokens / secs, 1) if secs > 0 else None,
               timed_steps=len(timed), timed_s=round(secs, 3), tokens_per_step=timed[0]["tokens"],
               micro_batches=timed[0].get("micro_batches"), first_step_s=round(step_recs[1]["step_time"], 2),
               peak_memory_gib=max((r.get("peak_memory_gib") or 0.0) for r in step_recs.values()) or None,
               losses=losses, losses_finite=all(math.isfinite(x) for x in losses if x is not None))
    if ev["fp8"]:
        c = ev["fp8"][0]
        out["fp8"] = {k: c.get(k) for k in ("converted", "skipped", "skipped_layers", "routers_kept_bf16", "torchao",
                                            "zero3_all_gather", "pad_inner_dim", "why")}
    if ev["fp8_profile"]:
        p = ev["fp8_profile"][0]
        out["fp8_profile"] = {k: p.get(k) for k in ("step", "fp8_matmuls", "fp8_gemm_kernels", "fp8_gemm_ms",
                                                    "kernels", "expected_about", "engaged", "active")}
    if ev["fp8_guard"]:
        out["fp8_guard"] = {"steps": [g["step"] for g in ev["fp8_guard"]],
                            "max_rel_diff": max(g["worst_rel_diff"] for g in ev["fp8_guard"]),
                            "all_ok": all(g["ok"] for g in ev["fp8_guard"])}
    out["warnings"] = [w.get("code") for w in ev["warning"]]
    return out


# ------------------------------------------------------------------ a case


def auto_decision(case: dict, device, smoke: bool) -> dict:
    """What --fp8 auto decides for the case on this machine (the worker's own function)."""
    from training.fast.fp8 import decide
    from training.runtime.errors import InputError

    try:
        on, why = decide("auto", method=case["method"], model_config=model_config(case), device=device, bf16=True,
                         compiled=not smoke or device.type == "cuda", moe=False, deepspeed=bool(case["zero"]),
                         rows=case["row"])
    except InputError as e:  # auto never raises; said rather than lost if it ever does
        on, why = False, f"error: {e}"
    return {"on": on, "why": why}


def auto_rows(entry: dict) -> None:
    """Auto's second look (training.fast.fp8.short_rows), as the worker takes it once its probe has sized the rows:
    from the FP8 arm's rows and the case's records a step."""
    from training.fast.fp8 import row_tokens, short_rows

    auto, rows = entry.get("auto") or {}, entry["arms"].get("fp8", {}).get("packing_tokens")
    if not auto.get("on") or not rows:
        return
    tokens = row_tokens(rows, entry["records"] * entry["seq"])
    why = short_rows("auto", True, tokens, f"{entry['records']} records of {entry['seq']:,} tokens a step in rows "
                     f"of {rows:,}")
    if why:
        entry["auto"] = {"on": False, "why": why, "before_rows": auto["why"]}


def compare(entry: dict) -> dict:
    a, b = entry["arms"].get("bf16", {}), entry["arms"].get("fp8", {})
    if a.get("status") != "ok" or b.get("status") != "ok":
        cut = "cut" in (a.get("status"), b.get("status"))
        return {"verdict": "cut" if cut else "error",
                "why": a.get("error") or b.get("error") or "an arm did not run"}
    rel = [abs(x - y) / abs(x) for x, y in zip(a["losses"], b["losses"]) if x]
    prof = b.get("fp8_profile") or {}
    engaged = bool(prof.get("engaged")) and b.get("fast_path_fp8") is True
    out = {"ratio": round(b["tokens_per_s"] / a["tokens_per_s"], 3),
           "max_rel_loss_diff": max(rel) if rel else None,
           "max_rel_loss_diff_step": rel.index(max(rel)) + 1 if rel else None, "parity_steps": len(rel),
           "loss_at": {str(s): [a["losses"][s - 1], b["losses"][s - 1]]
                       for s in (1, len(a["losses"]) // 2, len(a["losses"]))},
           "fp8_engaged": engaged, "bf16_arm_fp8": a.get("fast_path_fp8")}
    parity = out["max_rel_loss_diff"] is not None and out["max_rel_loss_diff"] <= PARITY_LIMIT
    out["parity"] = parity
    if a.get("fast_path_fp8") is not False:
        out["verdict"] = "bf16 arm ran FP8"
    else:
        out["verdict"] = verdict(engaged, parity, out["ratio"])
    auto_rows(entry)
    auto_on = bool(entry.get("auto", {}).get("on"))
    out["auto_agrees"] = auto_on == (out["verdict"] == "fp8 pays")
    return out


# ------------------------------------------------------------------ the report


def _f(x, fmt="{:,.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def markdown(doc: dict) -> str:
    v = doc["versions"]
    lines = [f"FP8 against bf16 through the worker, {doc['date']} on {doc['gpu']}; torch {v.get('torch')}, torchao "
             f"{v.get('torchao')}, transformers {v.get('transformers')}, DeepSpeed {v.get('deepspeed')}; "
             f"{doc.get('elapsed_s', 0):.0f} s of a {doc['budget_s']:.0f} s budget; {doc['steps']} steps an arm, "
             f"tokens/s over steps {doc['warmup'] + 1}-{doc['steps']}", "",
             "| case | layers | tokens/step | bf16 tokens/s | FP8 tokens/s | ratio (loop's) | loss bf16 at 1/mid/last | "
             "loss FP8 at 1/mid/last | max rel. loss diff | linears FP8 (skipped) | FP8 matmuls / GEMM kernels in "
             "step 2 | guard max | peak GiB bf16 / FP8 | auto | verdict |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for c in doc["cases"]:
        if c.get("skipped"):
            lines.append(f"| {c['case']} | - | - | - | - | - | - | - | - | - | - | - | - | - | **skipped**: "
                         f"{c['skipped']} |")
            continue
        a, b, cmp_ = c["arms"].get("bf16", {}), c["arms"].get("fp8", {}), c.get("compare", {})

        def tps(x):
            return x["status"] if x.get("status") not in (None, "ok") else _f(x.get("tokens_per_s"))

        at = cmp_.get("loss_at") or {}

        def losses(i: int, at=at) -> str:
            return " / ".join(f"{v[i]:.4f}" for v in at.values()) if at else "-"

        conv = b.get("fp8") or {}
        prof = b.get("fp8_profile") or {}
        guard = b.get("fp8_guard") or {}
        loop = LOOP_RATIOS.get(c["case"])
        ratio = f"{cmp_['ratio']:.3f}" if "ratio" in cmp_ else "-"
        auto = c.get("auto", {})
        agrees = "" if "auto_agrees" not in cmp_ else (" (agrees)" if cmp_["auto_agrees"] else " (**disagrees**)")
        lines.append(
            f"| {c['case']} | {c['layers']} | {c['tokens_per_step']:,} | {tps(a)} | {tps(b)} | {ratio}"
            f"{f' ({loop})' if loop else ''} | {losses(0)} | {losses(1)} | "
            f"{_f(cmp_.get('max_rel_loss_diff'), '{:.2e}')} | {_f(conv.get('converted'), '{}')} "
            f"({_f(conv.get('skipped'), '{}')}) | {_f(prof.get('fp8_matmuls'), '{}')} / "
            f"{_f(prof.get('fp8_gemm_kernels'), '{}')} | {_f(guard.get('max_rel_diff'), '{:.2e}')} | "
            f"{_f(a.get('peak_memory_gib'), '{:.1f}')} / {_f(b.get('peak_memory_gib'), '{:.1f}')} | "
            f"{'on' if auto.get('on') else 'off'}{agrees} | **{cmp_.get('verdict', '-')}** |")
    lines.append("")
    for c in doc["cases"]:
        for arm in ("bf16", "fp8"):
            r = c.get("arms", {}).get(arm, {})
            if r.get("status") not in (None, "ok"):
                lines.append(f"- {c['case']} {arm} {r['status']}: {r.get('error')}")
        rows = [f"{arm} {r['packing_tokens']:,} tokens ({r.get('micro_batches') or '-'} a step"
                + (", gradient checkpointing)" if r.get("gradient_checkpointing") else ")")
                for arm, r in c.get("arms", {}).items() if r.get("packing_tokens")]
        if rows:
            how = "as given" if c.get("row") else "sized by the worker's memory probe"
            lines.append(f"- {c['case']}: rows {how}: " + "; ".join(rows))
        for arm, r in c.get("arms", {}).items():
            for ln in r.get("probes") or []:
                lines.append(f"- {c['case']} {arm}: {ln}")
        if c.get("auto"):
            lines.append(f"- {c['case']}: --fp8 auto here: {c['auto']['why']}")
    return "\n".join(lines) + "\n"


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for m in ("torch", "torchao", "transformers", "peft", "deepspeed", "liger-kernel", "triton"):
        try:
            out[m] = version(m)
        except PackageNotFoundError:
            out[m] = None
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for fp8_worker.json, fp8_worker.md and fp8_worker.log")
    p.add_argument("--cases", default=None, help=f"comma-separated case names, run in the order given (default: "
                   f"{','.join(DEFAULT_CASES)}; known: {', '.join(CASES)})")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="skip a case whose estimate no longer fits; cut "
                   f"an arm past it (default {BUDGET_S}: a call is cut at {CALL_S}, the wheels' install comes first, "
                   f"and a cut arm takes up to {STOP_WAIT_S + KILL_WAIT_S} s to stop)")
    p.add_argument("--scratch", default=None, help="where models, data and the runs' outputs go (default: a folder "
                   "under /tmp)")
    p.add_argument("--cpu-smoke", action="store_true", help="the tiny shape on the CPU: every code path, no speed")
    args = p.parse_args(argv)
    began = time.monotonic()
    import torch

    table = SMOKE_CASES if args.cpu_smoke else CASES
    steps, warmup = (SMOKE_STEPS, SMOKE_WARMUP) if args.cpu_smoke else (STEPS, WARMUP)
    names = args.cases.split(",") if args.cases else list(table if args.cpu_smoke else DEFAULT_CASES)
    for n in names:
        if n not in table:
            p.error(f"--cases: unknown case {n!r} (known: {', '.join(table)})")
    cuda = torch.cuda.is_available() and not args.cpu_smoke
    if not cuda and not args.cpu_smoke:
        p.error("no CUDA device: run on a GPU, or use --cpu-smoke")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(args.scratch or f"/tmp/fp8_worker-{os.getpid()}")
    scratch.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.processor() or 'cpu'})"
    doc = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv), "gpu": gpu,
           "capability": list(torch.cuda.get_device_capability(0)) if cuda else None,
           "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if cuda else None,
           "versions": versions(), "steps": steps, "warmup": warmup, "budget_s": args.budget_s,
           "parity_limit": PARITY_LIMIT, "pays_at": PAYS_AT, "vocab": VOCAB, "cases": []}
    env = {**os.environ, **MULTICAST_OFF, "PYTHONPATH": os.pathsep.join([str(ROOT)] + [x for x in [os.environ.get(
        "PYTHONPATH")] if x]), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if args.cpu_smoke:
        env.update({"TRAINING_FP8_ON_CPU": "1", "TRAINING_COMPILE_BACKEND": "aot_eager", "OMP_NUM_THREADS": "2"})
        env.setdefault("TORCH_EXTENSIONS_DIR", "/tmp/qwen-tui-test-cache/torch_extensions")  # DeepSpeed's CPU op

    def save():
        doc["elapsed_s"] = round(time.monotonic() - began, 1)
        (out / "fp8_worker.json").write_text(json.dumps(doc, indent=1) + "\n")
        (out / "fp8_worker.md").write_text(markdown(doc))

    with open(out / "fp8_worker.log", "a") as log:
        for n in names:
            case = table[n]
            cfg = model_config(case)
            entry = {"case": n, **{k: v for k, v in case.items() if k != "est_s"}, "layers": cfg["num_hidden_layers"],
                     "hidden_size": cfg["hidden_size"], "tokens_per_step": case["records"] * case["seq"],
                     "auto": auto_decision(case, device, args.cpu_smoke), "arms": {}}
            doc["cases"].append(entry)
            left = args.budget_s - (time.monotonic() - began)
            if left < case["est_s"]:
                entry["skipped"] = f"{left:.0f} s of the budget left, the case needs about {case['est_s']} s"
                print(f"[{n}] skipped: {entry['skipped']}", flush=True)
                save()
                continue
            tmp = scratch / n
            model_dir = write_model(tmp, n, case)
            data = tmp / "data.jsonl"
            lens = write_data(data, model_dir, steps * case["records"], case["seq"])
            entry["records_off_length"] = sum(x != case["seq"] for x in lens)
            for arm, fp8 in (("bf16", "off"), ("fp8", "on")):
                cmd = worker_cmd(case, model_dir, data, tmp / f"out-{arm}", fp8, steps, scratch / "tokenized",
                                 args.cpu_smoke)
                print(f"[{n}] {arm}: --fp8 {fp8}, {steps} steps", flush=True)
                r = run_arm(n, arm, cmd, tmp / f"out-{arm}", steps, warmup, began + args.budget_s, env, log)
                entry["arms"][arm] = r
                if r["status"] == "ok":
                    print(f"[{n}] {arm}: {r['tokens_per_s']:,.0f} tokens/s, loss {r['losses'][0]:.4f} -> "
                          f"{r['losses'][-1]:.4f}, first step {r['first_step_s']} s, {r['wall_s']} s in all"
                          + (f", FP8: {r.get('fp8', {}).get('converted')} linears, "
                             f"{r.get('fp8_profile', {}).get('fp8_matmuls')} FP8 matmuls in step 2" if fp8 == "on"
                             else ""), flush=True)
                else:
                    print(f"[{n}] {arm}: {r['status']}: {r.get('error')}\n  " + "\n  ".join(r.get("log_tail", [])),
                          flush=True)
                save()
            entry["compare"] = compare(entry)
            print(f"[{n}] {json.dumps(entry['compare'])}", flush=True)
            save()
    save()
    print(markdown(doc), flush=True)
    if args.cpu_smoke:
        bad = [c["case"] for c in doc["cases"]
               if c.get("skipped") or c.get("compare", {}).get("verdict") in ("error", "cut")
               or not c.get("compare", {}).get("fp8_engaged") or c["compare"].get("bf16_arm_fp8") is not False]
        written = (out / "fp8_worker.json").is_file() and (out / "fp8_worker.md").is_file()
        if bad or not written:
            print(f"smoke: failed cases {bad}; table and JSON written: {written}", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
