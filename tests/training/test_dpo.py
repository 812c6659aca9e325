"""DPO in the worker (--stage dpo) on the tiny model: the step-0 identity, the curves over ranks, TRL's numbers.

At step 0 the policy is the reference, so every pair's loss is ln 2 and its rewards and margin are 0: on one
process, and on 2 ranks under ZeRO-3 (full fine-tuning) and ZeRO-2 (LoRA, whose reference is the base with the
adapters disabled). With the same global batch, the 2-rank runs reproduce the 1-process curves step by step.
The reward accuracy rises on builtin:demo-pref (made learnable). The final model's evaluation (loss, rewards,
margin, accuracy against the reference) equals what TRL's DPOTrainer computes for the same model, reference
and token ids.
"""

from __future__ import annotations

import json
import math

import pytest

from support.worker import assert_ok, run_worker, write_jsonl

pytestmark = pytest.mark.slow

LN2 = math.log(2)
COMMON = ["--data_path", "builtin:demo-pref", "--stage", "dpo", "--model_max_length", "128", "--save_strategy", "no",
          "--seed", "7", "--logging_steps", "1", "--tokenized_cache_dir", "none", "--use_cpu"]
FULL = ["--learning_rate", "1e-3", "--max_steps", "10", "--warmup_ratio", "0", "--lr_scheduler_type", "constant"]
LORA = ["--use_lora", "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0", "--learning_rate", "5e-3",
        "--max_steps", "4"]


@pytest.fixture(scope="module")
def eval_pairs(tmp_path_factory):
    from training.demo_data.make_demo_pref import build_pairs

    return str(write_jsonl(tmp_path_factory.mktemp("pairs") / "eval.jsonl", build_pairs()[-16:]))


@pytest.fixture(scope="module")
def one(tmp_path_factory, tiny_model, eval_pairs):
    run = run_worker(tmp_path_factory.mktemp("dpo-one") / "out", "--model_name_or_path", str(tiny_model), *COMMON,
                     *FULL, "--per_device_train_batch_size", "8", "--eval_data_path", eval_pairs)
    assert_ok(run)
    return run


@pytest.fixture(scope="module")
def zero3(tmp_path_factory, tiny_model):
    run = run_worker(tmp_path_factory.mktemp("dpo-zero3") / "out", "--model_name_or_path", str(tiny_model), *COMMON,
                     *FULL, "--per_device_train_batch_size", "4", "--deepspeed", "builtin:zero3", nproc=2)
    assert_ok(run)
    return run


def _step0(run):
    first = run.steps[0]
    assert first["step"] == 1 and first["pairs"] == 8
    assert first["loss"] == pytest.approx(LN2, abs=1e-5)
    assert first["rewards_chosen"] == pytest.approx(0, abs=1e-5)
    assert first["rewards_rejected"] == pytest.approx(0, abs=1e-5)
    assert first["rewards_margin"] == pytest.approx(0, abs=1e-5) and first["rewards_accuracy"] == 0.0


def _same_curve(a, b, keys=("loss", "rewards_chosen", "rewards_rejected", "rewards_margin", "rewards_accuracy")):
    assert [r["step"] for r in a.steps] == [r["step"] for r in b.steps]
    for ra, rb in zip(a.steps, b.steps):
        for k in keys:
            assert ra[k] == pytest.approx(rb[k], rel=1e-3, abs=1e-4), (ra["step"], k, ra[k], rb[k])


def test_step0_is_ln2_and_the_reward_accuracy_rises(one):
    _step0(one)
    start = one.event("start")[0]
    assert start["stage"] == "dpo" and start["records"] == 240
    ref = start["dpo_reference"]  # what the reference pass cost (bench/train_speed.py's DPO speed reads it)
    assert ref["pairs"] == start["usable_records"] and ref["tokens"] == start["tokens"] and ref["rows"] >= 1
    assert 0 < ref["first_row_seconds"] <= ref["seconds"] and 0 < ref["first_row_tokens"] <= ref["tokens"]
    acc = [r["rewards_accuracy"] for r in one.steps]
    assert sum(acc[-4:]) / 4 >= 0.75 and sum(acc[-4:]) > sum(acc[1:5]), acc
    assert one.steps[-1]["rewards_margin"] > 0.5, [r["rewards_margin"] for r in one.steps]
    (ev,) = one.event("eval")
    assert ev["eval_pairs"] == 16 and ev["eval_rewards_accuracy"] > 0.5
    assert (one.out / "dpo_reference.pt").is_file()  # kept for a resume of full-parameter DPO


def test_zero3_on_two_ranks_is_ln2_at_step0_and_reproduces_one_process(one, zero3):
    _step0(zero3)
    _same_curve(one, zero3)


def test_lora_zero2_on_two_ranks_reproduces_one_process_with_the_adapters_off_as_reference(tmp_path, tiny_model):
    base = ["--model_name_or_path", str(tiny_model), *COMMON, *LORA]
    single = run_worker(tmp_path / "one", *base, "--per_device_train_batch_size", "8")
    assert_ok(single)
    zero2 = run_worker(tmp_path / "z2", *base, "--per_device_train_batch_size", "4", "--deepspeed", "builtin:zero2",
                       nproc=2)
    assert_ok(zero2)
    for run in (single, zero2):
        _step0(run)
        assert "the base with the adapters disabled" in run.stderr
    _same_curve(single, zero2)
    assert single.steps[-1]["rewards_margin"] > 0


def test_step1_is_ln2_with_lora_dropout_on_and_in_bf16(tmp_path, tiny_model):
    """LoRA's B starts at zero, so at step 1 the adapters add exactly nothing whatever masks the dropout draws: the
    step's forward (dropout 0.3, training mode) equals the reference pass's (adapters off, eval mode, the pairs
    packed in other rows), here in bf16 too, and step 1 is ln 2. A step-1 loss off ln 2 on a GPU is the two
    passes' rounding there, not dropout (docs/guides/data-formats-and-dpo.md)."""
    from training.demo_data.make_demo_pref import build_pairs

    pairs = write_jsonl(tmp_path / "pairs.jsonl", build_pairs()[:16])
    flags = [pairs if f == "builtin:demo-pref" else f for f in COMMON]
    run = run_worker(tmp_path / "out", "--model_name_or_path", str(tiny_model), *flags, "--use_lora", "--lora_r", "8",
                     "--lora_dropout", "0.3", "--bf16", "--max_steps", "1", "--per_device_train_batch_size", "8")
    assert_ok(run)
    (first,) = run.steps
    assert run.event("start")[0]["precision"] == "bf16" and first["pairs"] == 8
    assert first["loss"] == pytest.approx(LN2, abs=1e-4)
    assert first["rewards_margin"] == pytest.approx(0, abs=1e-4)


def test_loss_and_rewards_equal_trls_dpo(one, eval_pairs, tiny_model):
    """The final model against the reference (the tiny model), on the evaluation pairs, through TRL's own loss."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    from training.data.encoding import IGNORE_INDEX, ChatEncoder
    from training.data.records import load_pairs

    tok = AutoTokenizer.from_pretrained(tiny_model)
    enc = ChatEncoder(tok, 128)
    examples = []
    for p in load_pairs(eval_pairs):
        c, r = enc.encode(p.chosen), enc.encode(p.rejected)
        first = next(i for i, x in enumerate(c.labels) if x != IGNORE_INDEX)
        assert c.input_ids[:first] == r.input_ids[:first]  # one prompt, two answers

        def answer(e, first=first):
            last = max(i for i, x in enumerate(e.labels) if x != IGNORE_INDEX)
            return e.input_ids[first:last + 1]
        examples.append({"prompt_ids": c.input_ids[:first], "chosen_ids": answer(c), "rejected_ids": answer(r)})
    policy = AutoModelForCausalLM.from_pretrained(one.out, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    from datasets import Dataset

    text = Dataset.from_list([{"prompt": "q", "chosen": "a", "rejected": "b"}])
    trainer = DPOTrainer(model=policy, ref_model=reference, processing_class=tok, train_dataset=text,
                         args=DPOConfig(output_dir=str(one.out / "trl"), beta=0.1, loss_type=["sigmoid"],
                                        report_to=[], use_cpu=True, bf16=False, fp16=False))
    batch = DataCollatorForPreference(pad_token_id=tok.pad_token_id)(examples)
    trainer.model.eval()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, batch).item()
    trl = {k: v[-1] for k, v in trainer._metrics["eval"].items()}
    (ev,) = one.event("eval")
    assert ev["eval_loss"] == pytest.approx(loss, abs=1e-4)
    assert ev["eval_rewards_chosen"] == pytest.approx(trl["rewards/chosen"], abs=1e-4)
    assert ev["eval_rewards_rejected"] == pytest.approx(trl["rewards/rejected"], abs=1e-4)
    assert ev["eval_rewards_margin"] == pytest.approx(trl["rewards/margins"], abs=1e-4)
    assert ev["eval_rewards_accuracy"] == pytest.approx(trl["rewards/accuracies"], abs=1e-6)
    assert ev["eval_logps_chosen"] == pytest.approx(trl["logps/chosen"], rel=1e-4)
    assert abs(ev["eval_rewards_margin"]) > 0.1  # a real comparison: the policy has moved off the reference


def test_ipo_and_the_sft_term_follow_their_definitions():
    import torch

    from training.fast.preference import dpo_losses

    c, r = torch.tensor([-10.0, -4.0]), torch.tensor([-12.0, -3.0])
    rc, rr = torch.tensor([-11.0, -4.5]), torch.tensor([-11.0, -3.5])
    nc, nr = torch.tensor([5.0, 2.0]), torch.tensor([4.0, 3.0])
    ipo, _, _ = dpo_losses(c, r, rc, rr, nc, nr, beta=0.2, loss="ipo")
    h = (c / nc - r / nr) - (rc / nc - rr / nr)
    assert torch.allclose(ipo, (h - 1 / (2 * 0.2)) ** 2)
    sig, ch, rj = dpo_losses(c, r, rc, rr, nc, nr, beta=0.1, loss="sigmoid", ftx=0.5)
    logits = (c - r) - (rc - rr)
    assert torch.allclose(sig, -torch.nn.functional.logsigmoid(0.1 * logits) + 0.5 * (-c / nc))
    assert torch.allclose(ch, 0.1 * (c - rc)) and torch.allclose(rj, 0.1 * (r - rr))


def test_chat_records_given_to_dpo_are_refused_naming_the_record(tmp_path, tiny_model):
    chat = write_jsonl(tmp_path / "chat.jsonl", [{"id": "c0", "messages": [{"role": "user", "content": "hi"},
                                                                            {"role": "assistant", "content": "yo"}]}])
    run = run_worker(tmp_path / "out", "--model_name_or_path", str(tiny_model), "--data_path", str(chat),
                     "--stage", "dpo", "--max_steps", "1", "--use_cpu")
    assert run.rc == 2, run.stderr[-2000:]
    assert "chat.jsonl:1: record 0 (id 'c0'): is not a preference pair" in run.stderr
    assert not (tmp_path / "out").exists()
    json.dumps(run.stderr[-200:])


def test_a_resumed_full_dpo_run_reads_its_reference_back_and_continues_the_curve(tmp_path, tiny_model):
    """Full fine-tuning: the weights are no longer the reference after step 1, so a resume must read the log-
    probabilities computed at the start (OUTPUT_DIR/dpo_reference.pt) and continue the curve exactly."""
    flags = ["--model_name_or_path", str(tiny_model), *COMMON, "--learning_rate", "1e-3", "--max_steps", "4",
             "--per_device_train_batch_size", "8"]
    flags[flags.index("--save_strategy") + 1] = "steps"
    first = run_worker(tmp_path / "out", *flags, "--save_steps", "2")
    assert_ok(first)
    again = run_worker(tmp_path / "out", *flags, "--save_steps", "2", "--resume_from_checkpoint",
                       str(tmp_path / "out" / "checkpoint-2"))
    assert_ok(again)
    assert "DPO reference" not in again.stderr  # read back, not computed from the trained weights
    assert again.event("start")[-1]["dpo_reference"] is None and again.event("start")[-1]["resumed_from"]
    resumed = {r["step"]: r for r in again.steps}
    for r in first.steps[:4]:
        if r["step"] > 2:
            assert resumed[r["step"]]["loss"] == pytest.approx(r["loss"], rel=1e-5)
            assert resumed[r["step"]]["rewards_margin"] == pytest.approx(r["rewards_margin"], rel=1e-4, abs=1e-6)
