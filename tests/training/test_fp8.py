"""--fp8 (training.fast.fp8, fp8_watch) on the CPU: which runs turn it on, which layers it converts, the layers'
bf16 path and their restoring, the profiled count of FP8 matmuls, the loss guard, and the worker end to end (LoRA
DPO through the guard and the profiled step; full SFT stopped by the guard), run in this process as
tests/training/test_errors.py runs it (bench/fp8_worker.py --cpu-smoke runs it as a program too, LoRA, full and
full under ZeRO-3).

torch's CPU _scaled_mm runs torchao's real float8 training here (TRAINING_FP8_ON_CPU=1 lets --fp8 on use it); the
decision's GPU branches (compute capability, torchao missing) take their facts from a stand-in, there being no GPU.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from training.fast import fp8
from training.fast.fp8_watch import Fp8ParityError, Fp8Watch, count_fp8
from training.finetune import main
from training.runtime.errors import InputError

CUDA = torch.device("cuda", 0)
SEVEN_B = {"hidden_size": 3584}
ONE_FIVE_B = {"hidden_size": 1536}


def decide(given="auto", method="lora", config=SEVEN_B, device=CUDA, bf16=True, compiled=True, moe=False,
           deepspeed=False, rows=None):
    return fp8.decide(given, method=method, model_config=config, device=device, bf16=bf16, compiled=compiled, moe=moe,
                      deepspeed=deepspeed, rows=rows)


@pytest.fixture
def hopper(monkeypatch):
    """A GPU of compute capability 9.0 as the decision sees it."""
    monkeypatch.setattr(fp8, "capability_of", lambda device: (9, 0) if device.type == "cuda" else None)


def test_auto_turns_fp8_on_only_where_it_was_measured_faster_through_the_worker(hopper, monkeypatch):
    # 7B LoRA without DeepSpeed was (1.10-1.12x in the worker's own rows of 8,192 tokens), and wider bases from it
    for config in (SEVEN_B, {"hidden_size": 5120}):
        on, why = decide(config=config)
        assert on and f"hidden size {config['hidden_size']}" in why and fp8.MEASURED in why and "sm_90" in why
        assert "rows checked once the memory probe has sized them" in why
    on, why = decide(rows=8192)  # rows given (--packing_tokens) and long enough: nothing left to check
    assert on and "rows checked" not in why
    # full fine-tuning and DeepSpeed runs measured no faster; a narrower base was not measured faster; short rows
    for kwargs, words in [({"method": "full"}, "full fine-tuning measured no faster"),
                          ({"deepspeed": True}, "under DeepSpeed FP8 measured within noise"),
                          ({"config": ONE_FIVE_B}, "hidden size 1536 is under 3584"),
                          ({"rows": 4096}, "about 4,096 tokens (--packing_tokens), under the 8,192")]:
        on, why = decide(**kwargs)
        assert not on and words in why and "--fp8 on runs it anyway" in why, (kwargs, why)
    # it says so before torchao is imported (seconds of a start-up saved)
    monkeypatch.setattr(fp8, "torchao_version", lambda: pytest.fail("auto imported torchao to stay off"))
    assert not decide(method="full")[0] and not decide(deepspeed=True)[0]
    monkeypatch.undo()
    monkeypatch.setattr(fp8, "capability_of", lambda device: (9, 0) if device.type == "cuda" else None)
    for kwargs, words in [({"method": "qlora"}, "Q-LoRA"), ({"bf16": False}, "needs --bf16"),
                          ({"compiled": False}, "compiled layers"), ({"moe": True}, "mixture of experts"),
                          ({"device": torch.device("cpu")}, "no CUDA GPU")]:
        on, why = decide(**kwargs)
        assert not on and why.startswith("off: ") and words in why, (kwargs, why)
    assert decide("off") == (False, "off as given")
    assert decide("on", method="full", deepspeed=True, rows=1024)[0]  # `on` runs it wherever it can run


def test_a_gpus_micro_batch_is_the_steps_tokens_over_as_few_rows_as_hold_them():
    assert fp8.row_tokens(8320, 16 * 1024) == 8192  # the bench's 7B LoRA: two rows of 8,192
    assert fp8.row_tokens(17152, 16 * 1024) == 16384  # one row holds the step
    assert fp8.row_tokens(8320, 16 * 1024, sequence_parallel=2) == 4096  # each GPU holds half a row
    assert fp8.row_tokens(65536, 3 * 900) == 2700  # a small step fills a short row, whatever the capacity
    assert fp8.row_tokens(0, 1000) == 0 and fp8.row_tokens(8192, 0) == 0


def test_auto_goes_back_to_bf16_once_the_probe_sizes_rows_too_short():
    assert fp8.short_rows("auto", True, 8192, "x") is None
    why = fp8.short_rows("auto", True, 2700, "3 records of 900 tokens on average a step in rows of 65,536")
    assert why and why.startswith("off: ") and "about 2,700 tokens (3 records of 900" in why
    assert fp8.RESULTS in why and "--fp8 on runs it anyway" in why
    assert fp8.short_rows("on", True, 1024, "x") is None  # the user's choice stands
    assert fp8.short_rows("auto", False, 1024, "x") is None  # nothing to turn off
    # checkpointing, which the probe may have turned on, keeps FP8 (7B LoRA ran 1.17x with it on an H100): the rows decide
    from types import SimpleNamespace

    fast = SimpleNamespace(fp8=True, packing=True, packing_tokens=65536, gradient_checkpointing=True)
    train = SimpleNamespace(per_device_train_batch_size=16, gradient_accumulation_steps=1, sequence_parallel_size=1)
    stats = SimpleNamespace(records=100, tokens=102400)
    assert fp8.second_look("auto", fast, stats, train, lazy=False, max_length=1024) is None  # 16,384 a step
    train.per_device_train_batch_size = 4
    assert "about 4,096 tokens" in fp8.second_look("auto", fast, stats, train, lazy=False, max_length=1024)


def test_auto_stays_off_and_on_refuses_without_fp8_tensor_cores_or_torchao(monkeypatch):
    monkeypatch.setattr(fp8, "capability_of", lambda device: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    on, why = decide()
    assert not on and "compute capability 8.0" in why and "A100" in why
    with pytest.raises(InputError, match=r"--fp8 on: NVIDIA A100-SXM4-80GB is compute capability 8.0"):
        decide("on")
    monkeypatch.setattr(fp8, "capability_of", lambda device: (9, 0))
    monkeypatch.setattr(fp8, "torchao_version", lambda: (None, "torchao's float8 training does not import"))
    assert decide() == (False, "off: torchao's float8 training does not import: pip install torchao (the gpu extra, "
                                "qwen-tui[gpu], brings it)")
    with pytest.raises(InputError, match="pip install torchao"):
        decide("on")


def test_an_older_torch_keeps_auto_off_and_a_much_older_one_refuses_on(hopper, monkeypatch):
    monkeypatch.setattr(fp8, "torch_version", lambda: (2, 8))
    on, why = decide()
    assert not on and "older than 2.11 (FP8 was measured with torch 2.11)" in why
    assert decide("on")[0]
    monkeypatch.setattr(fp8, "torch_version", lambda: (2, 5))
    with pytest.raises(InputError, match="older than 2.6"):
        decide("on")


def test_on_runs_where_it_can_even_unmeasured_and_refuses_where_it_cannot(hopper, monkeypatch):
    assert decide("on", config=ONE_FIVE_B)[0]  # the user's choice, though auto would not
    on, why = decide("on", compiled=False)
    assert on and "slower than with --compile" in why
    with pytest.raises(InputError, match="--fp8 on: Q-LoRA's 4-bit base"):
        decide("on", method="qlora")
    with pytest.raises(InputError, match="--fp8 on: no CUDA GPU"):
        decide("on", device=torch.device("cpu"))
    monkeypatch.setenv(fp8.CPU_ENV, "1")
    assert decide("on", device=torch.device("cpu"), compiled=False)[0]
    assert not decide("auto", device=torch.device("cpu"))[0]  # the tests' switch is for `on` only


def tiny(intermediate=120):
    """A two-layer Qwen2 whose MLP (120 wide) is not a multiple of 16: its three projections are skipped."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=intermediate, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, use_cache=False)
    return Qwen2ForCausalLM(cfg).to(torch.bfloat16)


def test_full_fine_tuning_converts_the_decoder_linears_whose_dimensions_allow_it():
    sel = fp8.select(tiny(), "full")
    assert [n for n, _ in sel.chosen] == [f"layers.{i}.self_attn.{p}_proj" for i in range(2) for p in "qkvo"]
    assert sel.skipped == [(f"layers.{i}.mlp.{p}", o, k) for i in range(2)
                           for p, o, k in (("gate_proj", 120, 64), ("up_proj", 120, 64), ("down_proj", 64, 120))]
    assert sel.routers == 0


def test_lora_converts_the_frozen_base_only_never_the_adapters():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny(), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "gate_proj"]))
    sel = fp8.select(model, "lora")
    names = [n for n, _ in sel.chosen]
    # the adapted projections' base_layer, and the projections left without an adapter (frozen too)
    assert names == [f"layers.{i}.self_attn.{p}" for i in range(2)
                     for p in ("q_proj.base_layer", "k_proj", "v_proj.base_layer", "o_proj")]
    assert [s[0] for s in sel.skipped] == [f"layers.{i}.mlp.{p}" for i in range(2)
                                           for p in ("gate_proj.base_layer", "up_proj", "down_proj")]
    assert all(not m.weight.requires_grad for _, m in sel.chosen)
    layers = fp8.convert(model, "lora", pad_inner_dim=False)
    assert layers.converted == 8 and layers.names == names
    for name, mod in model.named_modules():  # adapters, embedding and head stay nn.Linear / nn.Embedding
        if "lora_" in name or name.endswith(("lm_head", "embed_tokens")):
            assert type(mod) in (torch.nn.Linear, torch.nn.Embedding, torch.nn.ModuleDict, torch.nn.Dropout,
                                 torch.nn.Identity, torch.nn.ParameterDict), name


def test_a_mixture_of_experts_keeps_its_routers_in_bf16():
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    cfg = Qwen2MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                         shared_expert_intermediate_size=64, num_experts=16, num_experts_per_tok=2,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    sel = fp8.select(Qwen2MoeForCausalLM(cfg), "full")
    names = [n for n, _ in sel.chosen]
    assert sel.routers >= 2 and not [n for n in names if n.endswith((".gate", "shared_expert_gate"))]
    assert "layers.0.mlp.shared_expert.up_proj" in names and "layers.1.self_attn.q_proj" in names


def test_converted_layers_keep_their_parameters_and_run_bf16_on_demand():
    from torchao.float8.float8_linear import Float8Linear

    model = tiny(intermediate=128)
    params = {name: id(p) for name, p in model.named_parameters()}
    x = torch.randint(0, 128, (2, 32))
    with torch.no_grad():
        bf16 = model(x).logits
    layers = fp8.convert(model, "full", pad_inner_dim=False)
    assert layers.converted == 14 and not layers.skipped
    assert {name: id(p) for name, p in model.named_parameters()} == params  # same tensors: optimizer, ZeRO, saves
    with torch.no_grad():
        f8 = model(x).logits
        with layers.bf16_matmuls():
            assert all(type(m) is torch.nn.Linear for m in layers.modules)
            again = model(x).logits
        assert all(type(m) is Float8Linear for m in layers.modules)
    assert torch.equal(again, bf16)
    assert not torch.equal(f8, bf16) and (f8.float() - bf16.float()).abs().mean() < 0.1 * bf16.float().abs().mean()
    layers.restore()
    assert not layers.active and all(type(m) is torch.nn.Linear for m in layers.modules)
    with torch.no_grad():
        assert torch.equal(model(x).logits, bf16)


def test_the_profile_counts_fp8_matmuls_and_none_in_bf16():
    from torch.profiler import ProfilerActivity, profile

    def profiled(model):
        x = torch.randint(0, 128, (2, 32))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(x, labels=x).loss.backward()
        return count_fp8(prof, cuda=False)

    model = tiny(intermediate=128)
    assert profiled(model)["fp8_matmuls"] == 0
    layers = fp8.convert(model, "full", pad_inner_dim=False)
    seen = profiled(model)
    # forward, input gradient and weight gradient of each: the first layer's q/k/v inputs need no gradient in full
    # fine-tuning either (the embedding's output does), so each runs its three
    assert seen["fp8_matmuls"] == 3 * layers.converted and seen["fp8_gemm_kernels"] == 0


def watch(model, layers, mode, bound, records):
    x = torch.randint(0, 128, (2, 32))

    def reference(batch, num_items, num_tokens):
        return SimpleNamespace(ce=model(batch, labels=batch).loss, pref_sums=None)

    w = Fp8Watch(layers, mode=mode, reference=reference, device=torch.device("cpu"), guard_steps=2, bound=bound,
                 start_step=0, total_steps=10, write=records.append, is_main=True, method="full", compiled=False)
    with torch.no_grad():
        ref = w.reference(1, x, None, None)
        out = SimpleNamespace(ce=model(x, labels=x).loss, pref_sums=None)
    return w, ref, out


def test_the_guard_passes_close_losses_and_stops_guarding_after_its_steps():
    model = tiny(intermediate=128)
    layers, records = fp8.convert(model, "full", pad_inner_dim=False), []
    w, ref, out = watch(model, layers, "auto", 0.02, records)
    w.check(1, ref, out)
    (rec,) = records
    assert rec["event"] == "fp8_guard" and rec["ok"] and 0 < rec["rel_diff"] < 0.02 and layers.active
    assert rec["bf16_loss"] != rec["fp8_loss"]
    assert w.reference(3, torch.zeros(1, 8, dtype=torch.long), None, None) is None  # past --fp8_guard_steps
    assert w.profile_step == 2


def test_past_the_bound_auto_goes_back_to_bf16_and_on_stops():
    model = tiny(intermediate=128)
    layers, records = fp8.convert(model, "full", pad_inner_dim=False), []
    w, ref, out = watch(model, layers, "auto", 0.0, records)
    w.check(1, ref, out)
    assert [r.get("code") or r["event"] for r in records] == ["fp8_guard", "FP8_PARITY"]
    assert not records[0]["ok"] and "--fp8 auto turns FP8 off" in records[1]["message"]
    assert not layers.active and all(type(m) is torch.nn.Linear for m in layers.modules)
    assert w.reference(2, torch.zeros(1, 8, dtype=torch.long), None, None) is None  # nothing left to guard

    model = tiny(intermediate=128)
    layers = fp8.convert(model, "full", pad_inner_dim=False)
    w, ref, out = watch(model, layers, "on", 0.0, [])
    with pytest.raises(Fp8ParityError, match=r"FP8 loss parity failed at step 1: .* --fp8 on stops here"):
        w.check(1, ref, out)


@pytest.mark.parametrize("extra,message", [
    (["--bf16", "--fp8", "on"], "--fp8 on: no CUDA GPU"),
    (["--bf16", "--fp8", "on", "--q_lora"], "--fp8 on cannot run with --q_lora"),
    (["--fp8", "on"], "--fp8 on needs --bf16"),
    (["--fp8_guard_steps", "-1"], "--fp8_guard_steps must be 0 or more"),
], ids=["cpu", "qlora", "fp32", "guard-steps"])
def test_an_fp8_that_cannot_run_exits_2_before_anything_is_written(tmp_path, capsys, tiny_model, monkeypatch, extra,
                                                                    message):
    monkeypatch.delenv(fp8.CPU_ENV, raising=False)
    out = tmp_path / "out"
    rc = main(["--output_dir", str(out), "--model_name_or_path", str(tiny_model), "--data_path", "builtin:demo-chat",
               "--max_steps", "2", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and not out.exists(), err[-2000:]


@pytest.mark.slow
def test_fp8_on_stops_a_run_whose_loss_leaves_bf16s(tmp_path, capsys, tiny_model, monkeypatch):
    """--fp8_parity_bound 0: FP8's first loss is never bf16's to the last bit, so step 1's guard stops the run,
    with one error line and an end record that says why."""
    import json

    monkeypatch.setenv(fp8.CPU_ENV, "1")
    out = tmp_path / "out"
    rc = main(["--output_dir", str(out), "--model_name_or_path", str(tiny_model), "--data_path", "builtin:demo-chat",
               "--max_steps", "3", "--bf16", "--fp8", "on", "--fp8_parity_bound", "0", "--save_strategy", "no",
               "--per_device_train_batch_size", "4"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert rc == 1 and len(lines) == 1 and "FP8 loss parity failed at step 1" in lines[0], err[-3000:]
    assert "Traceback" not in err
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    guard = [r for r in recs if r.get("event") == "fp8_guard"]
    assert len(guard) == 1 and guard[0]["ok"] is False
    assert recs[-1]["event"] == "end" and recs[-1]["status"] == "error" and "Fp8ParityError" in recs[-1]["error"]


@pytest.mark.slow
def test_the_worker_runs_lora_dpo_on_an_fp8_base_and_proves_it(tmp_path, tiny_model, monkeypatch, caplog):
    """The worker with --fp8 on (on the CPU's _scaled_mm), in this process, LoRA DPO: the conversion (the frozen
    base), the profiled step's FP8 matmuls and the guard's records are in metrics.jsonl and the log, and the adapter
    is saved. DPO's loss compares the policy with reference log-probabilities computed before step 1 (in FP8 here):
    the guard compares the answers' log-likelihood instead, which FP8 and bf16 compute alike on the same weights."""
    import json
    import logging

    from training.demo_data.make_demo_pref import OUT as DEMO_PREF
    from training.fast.fp8_watch import measure

    sums = torch.tensor([0.1, -0.2, 1.0, -40.0, -60.0])
    assert measure(SimpleNamespace(ce=torch.tensor(0.69), pref_sums=sums)).item() == 100.0
    monkeypatch.setenv(fp8.CPU_ENV, "1")
    pairs = tmp_path / "pairs.jsonl"  # 8 of the demo's pairs: the reference pass reads every pair before step 1
    pairs.write_text("".join(DEMO_PREF.read_text().splitlines(keepends=True)[:8]))
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="training"):
        rc = main(["--output_dir", str(out), "--model_name_or_path", str(tiny_model), "--data_path", str(pairs),
                   "--stage", "dpo", "--use_lora", "--lora_r", "8", "--max_steps", "2", "--bf16", "--fp8", "on",
                   "--save_strategy", "no", "--per_device_train_batch_size", "4", "--learning_rate", "1e-4"])
    assert rc == 0, caplog.text[-3000:]
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]

    def event(name):
        return [r for r in recs if r.get("event") == name]

    assert recs[0]["fast_path"]["fp8"] is True and recs[0]["fast_path"]["why"]["fp8"].startswith("on as given")
    (conv,) = event("fp8")
    # 2 layers x 7 projections, the frozen base of each adapted one; the tiny model's dimensions are multiples of 16
    assert conv["converted"] == 14 and conv["skipped"] == 0 and conv["first_converted"][0].endswith("base_layer")
    assert conv["mode"] == "on" and conv["profile_step"] == 2 and conv["zero3_all_gather"] is None
    (prof,) = event("fp8_profile")
    assert prof["step"] == 2 and prof["engaged"] and prof["fp8_matmuls"] >= conv["converted"]
    guard = event("fp8_guard")
    assert [(g["step"], g["ok"], g["measure"]) for g in guard] == [(1, True, "answers' negative log-likelihood"),
                                                                   (2, True, "answers' negative log-likelihood")]
    assert all(g["rel_diff"] < 0.02 and g["bf16_loss"] > 1.0 for g in guard)
    assert not event("warning") and event("end")[0]["status"] == "ok"
    assert "FP8 (tensorwise, torchao" in caplog.text and "FP8 engaged: step 2 ran" in caplog.text
    assert (out / "adapter_model.safetensors").is_file()


@pytest.mark.slow
def test_auto_turns_fp8_back_off_once_the_rows_are_known_to_be_short(tmp_path, tiny_model, monkeypatch, caplog):
    """--fp8 auto as on an H100 for a 7B LoRA base (decide's GPU answer stood in: there is no GPU here), with
    steps of 4 demo records: the second look, once the rows are sized, finds a GPU's micro-batch far under 8,192
    tokens and runs bf16, saying why; no FP8 layer, profile or guard is left in the run."""
    import json
    import logging

    monkeypatch.setattr(fp8, "decide", lambda given, **kw: (True, "on: (a 7B LoRA base on an H100, stood in)"))
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="training"):
        rc = main(["--output_dir", str(out), "--model_name_or_path", str(tiny_model), "--data_path", "builtin:demo-chat",
                   "--use_lora", "--lora_r", "8", "--max_steps", "2", "--bf16", "--fp8", "auto", "--save_strategy",
                   "no", "--per_device_train_batch_size", "4"])
    assert rc == 0, caplog.text[-3000:]
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    why = recs[0]["fast_path"]["why"]["fp8"]
    assert recs[0]["fast_path"]["fp8"] is False and why.startswith("off: a GPU's micro-batch holds about "), why
    assert "4 records of " in why and "under the 8,192" in why
    assert not [r for r in recs if r.get("event") in ("fp8", "fp8_profile", "fp8_guard")]
    assert recs[-1]["event"] == "end" and recs[-1]["status"] == "ok"
    # converted first (as on the GPU, before the probes), then restored
    assert "FP8 (tensorwise, torchao" in caplog.text and "--fp8 auto: off: a GPU's micro-batch" in caplog.text


def test_the_conversion_record_says_what_a_reader_needs():
    layers = fp8.Fp8Layers([], [], [("layers.0.mlp.up_proj", 120, 64)], 0, "0.17.0", True)
    from training.fast.fp8_watch import conversion_record

    rec = conversion_record(layers, "auto", "on: ...", 3, 8, 0.02, 2)
    assert rec["event"] == "fp8" and rec["zero3_all_gather"] == "bf16" and rec["skipped"] == 1
    assert rec["skipped_layers"] == [{"name": "layers.0.mlp.up_proj", "out_features": 120, "in_features": 64}]
    assert "not multiples of 16: layers.0.mlp.up_proj (120x64)" in layers.summary()
    assert dataclasses.asdict(layers)["pad_inner_dim"] is True
