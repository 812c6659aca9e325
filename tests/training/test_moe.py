"""The worker trains the tiny mixture-of-experts Qwen (builtin:tiny-moe's shape: Qwen3-MoE, 8 experts, 2 a token;
and Qwen2-MoE's, with a shared expert) for real: its loss is transformers' own, the routers' load-balancing loss
included, on the fast path and off it; ZeRO-2 and ZeRO-3 over 2 processes reproduce one process; a LoRA adapter
on the experts saves, reloads and merges with the loss it was evaluated at.

The load-balancing loss is a function of each micro-batch's tokens (not a sum over them), so the multi-process
runs keep every micro-batch the same as the single process's: records of 65 to 128 tokens in packed rows of 128
(one record a row), or padded micro-batches that the step sampler hands out alike.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import ROOT
from support.worker import assert_ok, demo_records, eval_loss_of, run_worker, write_jsonl

pytestmark = pytest.mark.slow

COEF = 0.5  # large enough that a dropped or mis-weighted load-balancing term shows in loss and gradient norm


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory):
    from training.model.tiny import build_tiny

    d = tmp_path_factory.mktemp("moe")
    return {"qwen3_moe": str(build_tiny(d / "tiny-qwen3-moe", "qwen3_moe")),
            "qwen2_moe": str(build_tiny(d / "tiny-qwen2-moe", "qwen2_moe"))}


@pytest.fixture(scope="module")
def data(tmp_path_factory, moe_models):
    from transformers import AutoTokenizer

    from training.data.encoding import ChatEncoder
    from training.data.records import load_conversations

    d = tmp_path_factory.mktemp("moe-data")
    recs = demo_records()
    train = write_jsonl(d / "train.jsonl", recs)
    enc = ChatEncoder(AutoTokenizer.from_pretrained(moe_models["qwen3_moe"]), 10_000)
    lengths = [len(enc.encode(c).input_ids) for c in load_conversations(str(train))]
    mid = [r for r, n in zip(recs, lengths) if 64 < n <= 128]
    assert len(mid) >= 48, len(mid)
    return {"train": str(train), "mid": str(write_jsonl(d / "mid.jsonl", mid)),
            "eval": str(write_jsonl(d / "eval.jsonl", recs[-32:]))}


def common(model, *extra):
    return ["--model_name_or_path", model, "--model_max_length", "128", "--logging_steps", "1", "--seed", "7",
            "--save_strategy", "no", "--router_aux_loss_coef", str(COEF), *extra]


def hf_step_one(model_dir: str, data_path: str, batch: int, coef: float, train_router: bool) -> dict:
    """transformers' own loss (cross-entropy + coef x load-balancing loss, output_router_logits) and gradient norm
    on the records of the worker's first step (its step sampler, seed 7), padded as one batch."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.data.batches import Collator, StepSampler, build_dataset
    from training.data.encoding import ChatEncoder
    from training.data.records import load_conversations

    tok = AutoTokenizer.from_pretrained(model_dir)
    ds = build_dataset(load_conversations(data_path), ChatEncoder(tok, 128), lazy=False)
    idx = next(iter(StepSampler(len(ds), 1, 0, batch, 1, seed=7, total_steps=1)))
    b = Collator(tok.pad_token_id)([ds[i] for i in idx])
    out = {}
    for with_aux in (True, False):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model.router_aux_loss_coef = coef if with_aux else 0.0
        model.train()
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.requires_grad_(train_router)
        res = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"],
                    output_router_logits=True, use_cache=False)
        res.loss.backward()
        norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], float("inf"))
        key = "aux" if with_aux else "plain"
        out[key] = {"loss": res.loss.item(), "aux_loss": res.aux_loss.item(), "grad_norm": norm.item()}
    return out


@pytest.mark.parametrize("arch,flags", [
    ("qwen3_moe", []),  # the fast path: packed rows, our fused loss
    ("qwen3_moe", ["--no_packing"]),  # our loss on a padded batch
    ("qwen3_moe", ["--no_packing", "--fused_ce", "off"]),  # transformers' own loss module
    ("qwen3_moe", ["--compile"]),  # compiled decoder layers: the routers' hooks traced inside them
    # recomputed layers: the hooks keep nothing in the backward's recompute
    ("qwen3_moe", ["--gradient_checkpointing", "--no_packing", "--fused_ce", "off"]),
    ("qwen2_moe", []),  # a shared expert beside the routed ones
], ids=["fast", "padded", "hf", "fast-compiled", "hf-checkpointed", "qwen2-moe-fast"])
def test_worker_loss_is_transformers_loss_with_the_aux_term(tmp_path, monkeypatch, moe_models, data, arch, flags):
    """The first step's objective (logged loss + coef x aux_loss) and gradient norm are transformers' own with
    output_router_logits, and both differ from what they would be without the load-balancing term. Compiled
    layers go through Dynamo and AOTAutograd as on a GPU (aot_eager: no C++ build on CPU)."""
    monkeypatch.setenv("TRAINING_COMPILE_BACKEND", "aot_eager")
    run = run_worker(tmp_path / "out", *common(moe_models[arch], "--data_path", data["train"], "--max_steps", "1",
                                               "--per_device_train_batch_size", "4", "--train_router", *flags))
    assert_ok(run)
    start, (step,) = run.records[0], run.steps
    assert start["moe"]["experts"] == 8 and start["moe"]["experts_per_token"] == 2
    assert start["moe"]["router_aux_loss_coef"] == COEF and start["moe"]["shared_expert"] is (arch == "qwen2_moe")
    assert start["fast_path"]["packing"] is ("--no_packing" not in flags)
    assert start["fast_path"]["compile"] is ("--compile" in flags)
    assert start["fast_path"]["experts"] == "eager" and start["fast_path"]["why"]["experts"].startswith("eager: CPU")
    ref = hf_step_one(moe_models[arch], data["train"], 4, COEF, train_router=True)
    assert step["aux_loss"] == pytest.approx(ref["aux"]["aux_loss"], rel=1e-5)
    assert step["loss"] + COEF * step["aux_loss"] == pytest.approx(ref["aux"]["loss"], rel=1e-5)
    assert step["grad_norm"] == pytest.approx(ref["aux"]["grad_norm"], rel=1e-4)
    # Without the term transformers' figures differ by several times the tolerances above: they would see it.
    assert abs(ref["plain"]["loss"] - ref["aux"]["loss"]) > 0.5
    assert abs(ref["plain"]["grad_norm"] - ref["aux"]["grad_norm"]) > 3e-4 * ref["aux"]["grad_norm"]


FULL = ["--learning_rate", "1e-3", "--max_steps", "6", "--warmup_ratio", "0.1"]
LORA = ["--use_lora", "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0", "--learning_rate", "3e-3",
        "--max_steps", "6"]
# 4 records a step, each alone in a packed row of 128 tokens, the same rows however many processes
PACKED = ["--packing_tokens", "128", "--per_device_train_batch_size", "2"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, moe_models, data):
    """Plain single-process runs (no DeepSpeed): 2 micro-batches of 2 records a step."""
    runs = {}
    for name, method in (("full", FULL), ("lora", LORA)):
        run = run_worker(tmp_path_factory.mktemp(f"ref-{name}") / "out",
                         *common(moe_models["qwen3_moe"], *method, "--data_path", data["mid"]), *PACKED,
                         "--gradient_accumulation_steps", "2")
        assert_ok(run)
        runs[name] = run
    return runs


# Every data-parallel kind and both methods, ZeRO-3 with each (its leaf modules gather differently for adapters):
# DDP with LoRA and ZeRO-2 full reach no path these miss, and cost the suite 50 CPU-seconds.
@pytest.mark.parametrize("config,method", [("ddp", "full"), ("zero2", "lora"), ("zero3", "full"), ("zero3", "lora")])
def test_two_processes_reproduce_one_process(tmp_path, moe_models, data, reference, config, method):
    """DDP, ZeRO-2 and ZeRO-3 over 2 processes (one micro-batch of 2 records each) follow the single process's loss,
    load-balancing loss and gradient norm step by step; under ZeRO-3 each sparse MoE block is a leaf module. LoRA
    adapts the attention and every expert (peft's target_parameters on the fused weights)."""
    ds = [] if config == "ddp" else ["--deepspeed", f"builtin:{config}"]
    run = run_worker(tmp_path / "out", *common(moe_models["qwen3_moe"], *(FULL if method == "full" else LORA),
                                               "--data_path", data["mid"]), *PACKED, *ds, nproc=2)
    assert_ok(run)
    start = run.records[0]
    stage = 0 if config == "ddp" else int(config[-1])
    assert start["world_size"] == 2 and start["zero_stage"] == stage and start["method"] == method
    assert start["fast_path"]["packing"] is True and start["global_batch_size"] == 4
    ref = reference[method]
    assert start["trainable_parameters"] == ref.records[0]["trainable_parameters"]
    for a, b in zip(run.steps, ref.steps, strict=True):
        assert a["tokens"] == b["tokens"] and a["label_tokens"] == b["label_tokens"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), (a, b)
        assert a["aux_loss"] == pytest.approx(b["aux_loss"], rel=1e-4), (a, b)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3), (a, b)
    if config == "zero3":
        assert "Qwen3MoeSparseMoeBlock" in run.stderr  # named in the log of ZeRO-3's leaf modules


def test_lora_on_experts_saves_reloads_and_merges_with_the_same_eval_loss(tmp_path, moe_models, data):
    """LoRA on attention and the fused experts (peft's target_parameters), routers trained (--train_router, saved
    with the adapter): the adapter on its base, the worker's merged model and `python -m training.merge` all give
    the eval loss the run logged."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_dir = moe_models["qwen3_moe"]
    run = run_worker(tmp_path / "out", *common(base_dir, *LORA, "--data_path", data["train"]),
                     "--per_device_train_batch_size", "4", "--eval_data_path", data["eval"], "--train_router",
                     "--merge_lora")
    assert_ok(run)
    assert "mlp.experts.gate_up_proj" in run.stderr and "routers trained" in run.stderr
    adapter_cfg = json.loads((run.out / "adapter_config.json").read_text())
    assert sorted(adapter_cfg["target_parameters"]) == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    assert adapter_cfg["modules_to_save"] == ["mlp.gate"]
    (ev,) = run.event("eval")
    tok = AutoTokenizer.from_pretrained(run.out)
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), run.out)
    assert eval_loss_of(adapted, tok, data["eval"], 128) == pytest.approx(ev["eval_loss"], abs=1e-5)
    base = eval_loss_of(AutoModelForCausalLM.from_pretrained(base_dir), tok, data["eval"], 128)
    assert base > ev["eval_loss"] + 0.05  # the adapter carries the learning
    merged = AutoModelForCausalLM.from_pretrained(run.out / "merged")
    assert eval_loss_of(merged, tok, data["eval"], 128) == pytest.approx(ev["eval_loss"], abs=1e-4)
    out = tmp_path / "merged-cli"
    res = subprocess.run([sys.executable, "-m", "training.merge", str(run.out), "--base", base_dir, "--out", str(out),
                          "--check_data", data["eval"], "--model_max_length", "128"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    again = AutoModelForCausalLM.from_pretrained(out)
    assert eval_loss_of(again, tok, data["eval"], 128) == pytest.approx(ev["eval_loss"], abs=1e-4)


def test_use_lora_alone_trains_with_dropout_on_the_attention_only_on_one_and_two_zero3_ranks(tmp_path, moe_models,
                                                                                               data):
    """`--use_lora` and no other LoRA flag (the worker's defaults: the experts adapted, dropout 0.05) trains: the
    dropout goes on the attention's adapters, none on the fused experts' (peft has none there), one log line says
    so. On 2 ZeRO-3 ranks too, where a checkpoint whose rank-1 shard is gone is then skipped by `auto`, naming it,
    and the run resumes from the last whole one."""
    model = moe_models["qwen3_moe"]
    base = ["--model_name_or_path", model, "--data_path", data["train"], "--model_max_length", "128",
            "--logging_steps", "1", "--seed", "7", "--use_lora"]
    one = run_worker(tmp_path / "one", *base, "--max_steps", "2", "--save_strategy", "no")
    assert_ok(one)
    said = [ln for ln in one.stderr.splitlines() if "LoRA dropout 0.05 on the" in ln]
    assert len(said) == 1 and "none on the fused experts' adapters" in said[0], one.stderr[-3000:]
    assert one.records[0]["trainable_parameters"] > 2 * 64 * ((64 + 64) * 2 + (64 + 32) * 2)  # experts adapted too

    out = tmp_path / "zero3"
    z3 = ["--deepspeed", "builtin:zero3", "--per_device_train_batch_size", "2", "--save_strategy", "steps",
          "--save_steps", "2"]
    first = run_worker(out, *base, *z3, "--max_steps", "4", nproc=2)
    assert_ok(first)
    assert first.records[0]["zero_stage"] == 3 and first.records[0]["world_size"] == 2
    shard = next((out / "checkpoint-4").rglob("zero_pp_rank_1_*optim_states.pt"))
    shard.unlink()  # a node's shard lost (DeepSpeed#7546)
    again = run_worker(out, *base, *z3, "--max_steps", "6", "--resume_from_checkpoint", "auto", nproc=2)
    assert_ok(again)
    skipped = [ln for ln in again.stderr.splitlines() if "checkpoint-4 is skipped: incomplete" in ln]
    assert skipped and shard.relative_to(out / "checkpoint-4").as_posix() + " is missing" in skipped[0], \
        again.stderr[-3000:]
    at = max(i for i, r in enumerate(again.records) if r.get("event") == "start")  # metrics.jsonl is appended to
    start, later = again.records[at], again.records[at + 1:]
    assert start["start_step"] == 2 and start["resumed_from"].endswith("checkpoint-2"), start
    assert [r["step"] for r in later if "loss" in r and "event" not in r] == [3, 4, 5, 6]


def test_qlora_of_fused_experts_is_refused_naming_why(tmp_path, moe_models, data):
    run = run_worker(tmp_path / "out", *common(moe_models["qwen3_moe"], "--q_lora", "--data_path", data["train"],
                                               "--max_steps", "1"))
    assert run.rc == 2, run.stderr[-2000:]
    assert "fused as 3-D tensors, which bitsandbytes cannot quantize" in run.stderr
    assert not (tmp_path / "out").exists()  # nothing written


def test_expert_layout_is_read_from_the_config_on_the_meta_device(moe_models):
    """What the Q-LoRA and LoRA-dropout refusals decide on, before any weight loads: transformers 5 fuses the experts
    (3-D weights); a first layer with a dense MLP does not hide them; a config with no sparse layer has none."""
    from training.model.moe import layout_of_config, moe_shape

    for arch, path in moe_models.items():
        cfg = json.loads((Path(path) / "config.json").read_text())
        assert moe_shape(cfg).num_experts == 8 and moe_shape(cfg).shared_expert is (arch == "qwen2_moe")
        assert layout_of_config(cfg) == "fused"
        assert layout_of_config({**cfg, "mlp_only_layers": [0]}) == "fused"
        assert layout_of_config({**cfg, "mlp_only_layers": [0, 1]}) == "none"


def _loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("impl,compiled", [("grouped_mm", False), ("lean", False), ("lean", True)])
def test_experts_kernels_give_the_eager_loss_and_gradients(moe_models, impl, compiled):
    """The grouped kernels the worker picks on CUDA compute what transformers' reference loop computes: the same
    loss and gradient of every weight (experts, routers, attention) on the tiny MoE in fp32 on the CPU, where
    torch's grouped matmul runs too; "lean" also through Dynamo and AOTAutograd, as the worker's compiled layers
    run it (custom backward of its gathers)."""
    import torch
    from transformers import AutoModelForCausalLM

    from training.fast.compile import compile_decoder_layers
    from training.model import moe_experts

    ref = AutoModelForCausalLM.from_pretrained(moe_models["qwen3_moe"], dtype=torch.float32)
    ids = torch.randint(0, ref.config.vocab_size, (2, 96), generator=torch.Generator().manual_seed(3))
    assert moe_experts.apply(ref, "eager", torch.device("cpu"))[0] == "eager"
    model = AutoModelForCausalLM.from_pretrained(moe_models["qwen3_moe"], dtype=torch.float32)
    assert moe_experts.apply(model, impl, torch.device("cpu")) == (impl, "as given")
    assert model.config._experts_implementation == impl
    if compiled:
        compile_decoder_layers(model, backend="aot_eager")
    loss0, g0 = _loss_and_grads(ref, ids)
    loss, g = _loss_and_grads(model, ids)
    assert loss == pytest.approx(loss0, rel=1e-6)
    assert g.keys() == g0.keys() and any(".experts." in n for n in g)
    for n in g0:
        assert torch.allclose(g[n], g0[n], rtol=1e-4, atol=1e-6 * float(g0[n].abs().max())), n


def test_experts_choice_is_eager_on_cpu_and_grouped_where_asked(moe_models):
    """auto keeps transformers' reference loop on the CPU (grouped matmuls are for CUDA); a given kernel is set as
    given; a model without experts implementations (one MLP module an expert) stays eager and refuses another;
    a dense model has nothing to choose."""
    import torch
    from transformers import AutoModelForCausalLM

    from training.model import moe_experts
    from training.model.tiny import build_tiny
    from training.runtime.errors import InputError

    cpu = torch.device("cpu")
    impl, why = moe_experts.choose("auto", cpu, has_interface=True)
    assert impl == "eager" and why.startswith("eager: CPU")
    assert moe_experts.choose("grouped_mm", cpu, has_interface=True) == ("grouped_mm", "as given")
    assert moe_experts.choose("auto", cpu, has_interface=False)[0] == "eager"
    model = AutoModelForCausalLM.from_pretrained(moe_models["qwen3_moe"])
    assert model.config._experts_implementation == "grouped_mm"  # transformers' own default, also on the CPU
    assert moe_experts.apply(model, "auto", cpu)[0] == "eager" and model.config._experts_implementation == "eager"
    dense = AutoModelForCausalLM.from_pretrained(str(build_tiny(Path(moe_models["qwen3_moe"]).parent / "dense")))
    assert moe_experts.apply(dense, "auto", cpu) is None

    class NoInterface(torch.nn.Module):  # a model class without set_experts_implementation (transformers 4's)
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

    assert moe_experts.apply(NoInterface(model), "auto", cpu)[0] == "eager"
    with pytest.raises(InputError, match="no experts implementations"):
        moe_experts.apply(NoInterface(model), "lean", cpu)


def test_router_logits_hooks_compile_one_graph_for_all_layers():
    """The routers' hooks keep each layer's logits on its router: the decoder layers, compiled once for all (the
    worker's regional compilation), compile one graph, not one per layer until torch stops compiling (a hook
    appending to one list failed a guard on its length in every layer); the aux loss is the uncompiled one."""
    import torch
    from torch._dynamo.utils import counters
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from training.fast.compile import compile_decoder_layers
    from training.model import moe

    torch._dynamo.reset()
    counters.clear()
    cfg = Qwen3MoeConfig(vocab_size=256, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                         num_hidden_layers=12, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         num_experts=8, num_experts_per_tok=2, use_cache=False)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg)
    router = moe.RouterAux(model, moe.moe_shape(cfg.to_dict()), 0.01)
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    with router.collecting():
        model(input_ids=ids)
    ref = router.aux(None)
    compile_decoder_layers(model, backend="eager")
    for _ in range(2):
        with router.collecting():
            model(input_ids=ids)
        assert torch.equal(router.aux(None), ref)
    assert counters["stats"]["unique_graphs"] == 1
    with pytest.raises(RuntimeError, match="of 0 MoE layers collected"):
        router.aux(None)  # forgotten once read
