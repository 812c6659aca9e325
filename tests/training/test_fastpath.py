"""The GPU fast path (training.fast) on CPU: each piece against the plain computation it replaces.

- packing: records keep their own positions and labels, nothing crosses a boundary;
- packed attention: a packed row gives each record the logits it gets alone;
- chunked linear cross-entropy: the same loss and gradients as full logits;
- the LM head on supervised positions only: the same loss and gradients;
- the whole fast path (packing + chunked loss on supervised positions + fused AdamW, and per-layer compile through
  the aot_eager backend) trains the tiny model to the same loss curve as the plain padded path,
  same data, same seed, 50 steps;
- the token-budget planner's arithmetic.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from support.worker import decide_for
from training.fast import autobatch
from training.fast.attention import use_packed_attention
from training.fast.compile import compile_decoder_layers
from training.fast.loss import linear_cross_entropy_sum, shift_labels
from training.fast.optim import make_adamw
from training.fast.packing import balanced_bins, first_fit, pack, pack_batches, segment_ids
from training.fast.step import micro_batch_loss_sum


def _records(n: int, vocab: int, seed: int, lo: int = 4, hi: int = 60):
    """Records with a learnable rule (each id is the previous plus a per-record stride, mod 97), so a
    loss curve has somewhere to go."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(lo, hi)
        start, stride = rng.randrange(97), rng.choice([1, 2, 3])
        ids = [(start + stride * j) % 97 for j in range(length)]
        prompt = rng.randint(1, length - 2)
        out.append(SimpleNamespace(input_ids=ids, labels=[-100] * prompt + ids[prompt:]))
    return out


def _tiny(seed: int = 0, vocab: int = 512):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, use_cache=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).float()


# ------------------------------------------------------------------ packing


def test_first_fit_keeps_order_and_capacity():
    lens = [30, 50, 20, 10, 45, 5]
    bins = first_fit(lens, 64)
    assert sorted(i for b in bins for i in b) == list(range(len(lens)))
    assert all(sum(lens[i] for i in b) <= 64 for b in bins)
    assert bins[0][:2] == [0, 2]  # 30, then 50 does not fit, 20 does
    with pytest.raises(ValueError, match="more than the packing capacity"):
        first_fit([65], 64)


def test_balanced_bins_fewest_rows_evenly_filled():
    rng = random.Random(3)
    lens = [rng.randint(50, 2000) for _ in range(64)]
    for cap in (2048, 4096, 13312, 31744):
        bins = balanced_bins(lens, cap)
        assert sorted(i for b in bins for i in b) == list(range(len(lens)))  # every record, once
        assert all(b == sorted(b) for b in bins)  # the sampler's order within a row
        loads = [sum(lens[i] for i in b) for b in bins]
        assert max(loads) <= cap
        assert len(bins) <= len(first_fit(lens, cap))
        if cap >= 4096:  # many records a row: as few rows as the tokens need, none a small remainder
            assert len(bins) == -(-sum(lens) // cap)
            assert max(loads) - min(loads) <= max(lens)
    # 3 x 60 in rows of 100: ceil(180/100) = 2 rows cannot hold them, so a third row is opened
    assert sorted(map(len, balanced_bins([60, 60, 60], 100))) == [1, 1, 1]
    assert balanced_bins([], 100) == []
    with pytest.raises(ValueError, match="more than the packing capacity"):
        balanced_bins([10, 101], 100)
    with pytest.raises(ValueError, match="record 1 is empty"):
        balanced_bins([10, 0], 100)


def test_pack_restarts_positions_and_masks_first_label():
    recs = _records(3, 100, seed=1, lo=5, hi=9)
    row = pack(recs, 40, pad_id=7, pad_multiple=8, max_segment=9)
    n = sum(len(r.input_ids) for r in recs)
    width = row["input_ids"].shape[1]
    assert width == -(-n // 8) * 8 and row["real_tokens"] == n
    cu = row["cu_seq_lens"].tolist()
    assert cu[0] == 0 and cu[-1] == width
    assert max(b - a for a, b in zip(cu[:-1], cu[1:])) <= 9
    for k, r in enumerate(recs):
        a, b = cu[k], cu[k + 1]
        assert row["input_ids"][0, a:b].tolist() == r.input_ids
        assert row["position_ids"][0, a:b].tolist() == list(range(len(r.input_ids)))
        assert row["labels"][0, a] == -100  # never predicted across the boundary
        assert row["labels"][0, a + 1:b].tolist() == r.labels[1:]
    assert (row["labels"][0, n:] == -100).all() and (row["input_ids"][0, n:] == 7).all()
    seg = segment_ids(row["cu_seq_lens"], width)
    assert seg[cu[1] - 1] == 0 and seg[cu[1]] == 1


# ------------------------------------------------------------------ attention and loss


def test_packed_row_gives_each_record_its_own_logits():
    model = _tiny()
    recs = _records(5, 512, seed=2)
    alone = [model(input_ids=torch.tensor([r.input_ids])).logits[0] for r in recs]
    use_packed_attention(model)
    row = pack(recs, 400, pad_id=0, pad_multiple=16)
    out = model.model(input_ids=row["input_ids"], position_ids=row["position_ids"],
                      packed_cu_seq_lens=row["cu_seq_lens"], packed_max_length=row["max_length"])
    logits = model.lm_head(out.last_hidden_state)[0]
    cu = row["cu_seq_lens"].tolist()
    for k, ref in enumerate(alone):
        torch.testing.assert_close(logits[cu[k]:cu[k + 1]], ref, atol=2e-5, rtol=1e-4)


def test_packed_attention_differs_without_boundaries():
    """The check above can fail: one segment for the whole row lets later records see earlier ones."""
    model = _tiny()
    recs = _records(3, 512, seed=3)
    ref = model(input_ids=torch.tensor([recs[1].input_ids])).logits[0]
    use_packed_attention(model)
    row = pack(recs, 400, pad_id=0)
    n = row["real_tokens"]
    whole = torch.tensor([0, n, row["input_ids"].shape[1]], dtype=torch.int32)
    pos = torch.arange(row["input_ids"].shape[1]).unsqueeze(0)
    out = model.model(input_ids=row["input_ids"], position_ids=pos, packed_cu_seq_lens=whole, packed_max_length=400)
    a, b = row["cu_seq_lens"][1].item(), row["cu_seq_lens"][2].item()
    assert not torch.allclose(model.lm_head(out.last_hidden_state)[0, a:b], ref, atol=1e-3)


@pytest.mark.parametrize("trainable_head", [True, False])
def test_chunked_cross_entropy_matches_full_logits(trainable_head):
    g = torch.Generator().manual_seed(4)
    h = torch.randn(2, 37, 16, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64, generator=g, requires_grad=trainable_head)
    labels = torch.randint(0, 50, (2, 37), generator=g)
    labels[:, :5] = -100
    labels[1, 20:] = -100
    ref, n_ref = linear_cross_entropy_sum(h, w, labels, impl="plain")
    gh_ref, *gw_ref = torch.autograd.grad(ref * 0.5, [h] + ([w] if trainable_head else []))
    got, n = linear_cross_entropy_sum(h, w, labels, impl="chunked", chunk_size=7)
    gh, *gw = torch.autograd.grad(got * 0.5, [h] + ([w] if trainable_head else []))
    assert n == n_ref == (shift_labels(labels) != -100).sum()
    # the reference by hand: position t predicts labels[t + 1]
    logits = h[:, :-1] @ w.t()
    by_hand = F.cross_entropy(logits.reshape(-1, 50), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum")
    torch.testing.assert_close(ref, by_hand)
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gh, gh_ref, rtol=1e-6, atol=1e-8)
    if trainable_head:
        torch.testing.assert_close(gw[0], gw_ref[0], rtol=1e-6, atol=1e-8)


def test_pack_lists_the_supervised_positions_and_their_targets():
    recs = _records(6, 100, seed=12)
    row = pack(recs, 400, pad_id=0, pad_multiple=16, max_segment=64)
    target = shift_labels(row["labels"])[0]
    want = (target != -100).nonzero().squeeze(1)
    assert row["loss_positions"].dtype == torch.long and torch.equal(row["loss_positions"], want)
    assert torch.equal(row["loss_targets"], target[want])
    n_label = sum(sum(1 for x in r.labels[1:] if x != -100) for r in recs)
    # none across a record boundary or in the padding, one per supervised label after a record's first token
    assert len(want) == n_label and int(want.max()) < row["real_tokens"] - 1
    assert 0 < n_label < row["real_tokens"] - len(recs), "the records must mix prompts and answers"


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_labelled_logits_give_the_same_loss_and_gradients(lora):
    """The LM head on the supervised positions only: the same summed loss, count and gradients of every
    parameter (a tied head too) as the head on every position."""
    from training.fast.apply import empty_row

    grads = {}
    for only in (False, True):
        model = _tiny(seed=13)
        if lora:
            from peft import LoraConfig, get_peft_model

            torch.manual_seed(14)
            model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM",
                                                     target_modules=["q_proj", "v_proj", "down_proj"]))
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    torch.nn.init.normal_(p, std=0.02)  # B starts at zero: let the adapters carry a gradient
        use_packed_attention(model)
        row = pack(_records(7, 512, seed=15), 400, pad_id=0, pad_multiple=16, max_segment=64)
        s, n = micro_batch_loss_sum(model, row, "chunked", max_segment=64, chunk_size=50, labelled_only=only)
        s.backward()
        pad = empty_row(32, 0, 64)  # a row of padding: nothing to predict, and still a backward
        s0, n0 = micro_batch_loss_sum(model, pad, "chunked", max_segment=64, labelled_only=only)
        assert s0.item() == 0.0 and int(n0) == 0 and s0.requires_grad
        s0.backward()
        grads[only] = (float(s), int(n), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    (s_all, n_all, g_all), (s_sel, n_sel, g_sel) = grads[False], grads[True]
    assert n_sel == n_all > 0
    assert s_sel == pytest.approx(s_all, rel=1e-6)
    assert set(g_sel) == set(g_all) and len(g_all) > (6 if lora else 20)
    for k in g_all:
        # float32 sums in another order: equal to a millionth of the gradient's scale
        scale = g_all[k].abs().max().item()
        assert scale > 0 and (g_sel[k] - g_all[k]).abs().max().item() <= 1e-6 * scale, k


def test_labelled_logits_switch_is_decided_with_packing_and_refused_without():
    from training.runtime.errors import InputError

    auto = _decide(argv=[], device="cpu")
    assert auto.packing and auto.ce == "chunked" and auto.labelled_logits
    assert auto.why["labelled_logits_only"].startswith("on:") and "labelled logits only on" in auto.summary()
    plain = _decide(argv=["--fused_ce", "off"], device="cpu")
    assert plain.ce == "plain" and not plain.labelled_logits
    assert _decide(argv=["--no_packing"], device="cpu").why["labelled_logits_only"] == "off: needs packing"
    assert not _decide(argv=["--no_labelled_logits_only"], device="cpu").labelled_logits
    assert _decide(argv=["--fused_ce", "off", "--labelled_logits_only"], device="cpu").labelled_logits
    with pytest.raises(InputError, match="--labelled_logits_only selects a packed row's supervised positions"):
        _decide(argv=["--no_packing", "--labelled_logits_only"], device="cpu")


def test_the_fast_path_runs_under_every_zero_stage(monkeypatch):
    """Under ZeRO-1/2/3 the engine wraps model + loss: packed rows without the full logits (ZeRO-3 gathers the
    LM head for the loss), compiled layers, fused AdamW and the memory probe, which runs once the engine exists."""
    import training.fast.choice as fp

    for stage in (1, 2, 3):
        z = decide_for(["--use_lora"], "cpu", deepspeed=True, zero_stage=stage)
        assert z.ce == "chunked" and z.packing and z.our_loss and z.labelled_logits, stage
        assert f"ZeRO-{stage}: the rows of a step end it" in z.why["packing"]
        assert not decide_for(["--no_packing"], "cpu", deepspeed=True, zero_stage=stage).packing
        assert decide_for(["--fused_ce", "chunked"], "cpu", deepspeed=True, zero_stage=stage).ce == "chunked"
    assert decide_for(["--fused_ce", "off"], "cpu", deepspeed=True, zero_stage=3).ce == "plain"  # packed, full logits
    assert decide_for(["--fused_ce", "off", "--no_packing"], "cpu", deepspeed=True, zero_stage=3).ce == "hf"
    # On CUDA: compiled layers, fused AdamW and the probe-sized rows, as without DeepSpeed
    monkeypatch.setattr(fp, "_varlen_available", lambda: True)
    monkeypatch.setattr(fp, "_cudnn_unfit", lambda: "not asked here")
    monkeypatch.setattr("training.fast.compile.compile_available", lambda device: True)
    for stage in (2, 3):
        gpu = decide_for(["--use_lora", "--bf16"], "cuda", deepspeed=True, zero_stage=stage)
        assert gpu.packing and gpu.auto_micro_batch and gpu.compile and gpu.fused_adamw, stage
        assert "measured after the engine is built" in gpu.why["auto_micro_batch"]
        off = decide_for(["--use_lora", "--bf16", "--no_compile", "--no_fused_adamw", "--no_auto_micro_batch"],
                         "cuda", deepspeed=True, zero_stage=stage)
        assert not (off.compile or off.fused_adamw or off.auto_micro_batch)  # each one a switch
    assert decide_for(["--use_lora", "--bf16"], "cuda").auto_micro_batch  # plain DDP: the probe sizes the rows


# ------------------------------------------------------------------ the whole path, 50 steps


def _plain_step_loss(model, recs, mb: int):
    """The plain path: micro-batches of `mb` records padded to their longest, HF logits, one loss per step."""
    n_label = sum(sum(1 for x in r.labels[1:] if x != -100) for r in recs)
    total = 0.0
    for i in range(0, len(recs), mb):
        part = recs[i:i + mb]
        width = max(len(r.input_ids) for r in part)
        ids = torch.zeros(len(part), width, dtype=torch.long)
        lab = torch.full((len(part), width), -100)
        mask = torch.zeros(len(part), width, dtype=torch.long)
        for j, r in enumerate(part):
            ids[j, :len(r.input_ids)] = torch.tensor(r.input_ids)
            lab[j, :len(r.labels)] = torch.tensor(r.labels)
            mask[j, :len(r.input_ids)] = 1
        logits = model(input_ids=ids, attention_mask=mask).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), lab[:, 1:].reshape(-1),
                               ignore_index=-100, reduction="sum") / n_label
        loss.backward()
        total += loss.item()
    return total


def _fast_step_loss(model, recs, capacity: int):
    n_label = sum(sum(1 for x in r.labels[1:] if x != -100) for r in recs)
    total = 0.0
    for row in pack_batches(recs, capacity, pad_id=0, pad_multiple=16, max_segment=64):
        s, _ = micro_batch_loss_sum(model, row, "chunked", max_segment=64, chunk_size=100, labelled_only=True)
        loss = s / n_label
        loss.backward()
        total += loss.item()
    return total


def _train(model, fast: bool, records, steps: int, per_step: int, lora: bool, compile_layers: bool = False):
    if lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(11)
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                 "gate_proj", "up_proj", "down_proj"]))
    if fast:
        use_packed_attention(model)
        if compile_layers:
            compile_decoder_layers(model, backend="aot_eager")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_adamw([{"params": params, "weight_decay": 0.0}], lr=3e-3 if lora else 1e-3, fused=fast)
    assert opt.is_fused == fast
    losses = []
    for step in range(steps):
        recs = records[step * per_step:(step + 1) * per_step]
        loss = _fast_step_loss(model, recs, capacity=160) if fast else _plain_step_loss(model, recs, mb=4)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss)
    return losses


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_fast_path_keeps_the_loss_curve(lora):
    steps, per_step = 50, 8
    records = _records(steps * per_step, 512, seed=5)
    plain = _train(_tiny(seed=6), False, records, steps, per_step, lora)
    fast = _train(_tiny(seed=6), True, records, steps, per_step, lora)
    assert plain[-1] < plain[0] - 0.3, "the plain run must learn, or the comparison shows nothing"
    diffs = [abs(a - b) / a for a, b in zip(plain, fast)]
    assert max(diffs) < 1e-4, f"largest relative loss difference {max(diffs):.2e} at step {diffs.index(max(diffs))}"


def test_compiled_layers_keep_the_loss_curve():
    steps, per_step = 8, 8
    records = _records(steps * per_step, 512, seed=7)
    eager = _train(_tiny(seed=8), True, records, steps, per_step, lora=False)
    compiled = _train(_tiny(seed=8), True, records, steps, per_step, lora=False, compile_layers=True)
    assert max(abs(a - b) / a for a, b in zip(eager, compiled)) < 1e-4


def _masked_sdpa(q, k, v, cu, scale: float):
    """The per-record attention as one masked SDPA (no Python loop over records), so dynamo traces a packed
    row without a graph break, as it does through flash varlen on CUDA."""
    t = q.shape[2]
    pos = torch.arange(t)
    seg = torch.searchsorted(cu[1:].long(), pos, right=True)
    mask = (seg[:, None] == seg[None, :]) & (pos[:, None] >= pos[None, :])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def test_compiled_layers_compile_once_for_every_row_width(monkeypatch):
    """Rows of new widths and record counts after the first compile do not compile the layers again
    (run5 on the H200: one recompile cost an 8.4 s step), and the loss is the eager one."""
    from training.fast import attention

    monkeypatch.setattr(attention, "_per_record_sdpa", _masked_sdpa)
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    eager, compiled = _tiny(seed=3), _tiny(seed=3)
    for m in (eager, compiled):
        use_packed_attention(m)
    compile_decoder_layers(compiled, backend=counting_backend)
    recs = _records(40, 512, seed=4)
    widths, segments = set(), set()
    at = 0
    for n in (3, 5, 2, 7, 4):  # rows of different widths and record counts
        row = pack(recs[at:at + n], 400, pad_id=0, pad_multiple=16, max_segment=64)
        at += n
        widths.add(row["input_ids"].shape[1])
        segments.add(len(row["cu_seq_lens"]))
        s_c, n_c = micro_batch_loss_sum(compiled, row, "chunked", max_segment=64, chunk_size=100)
        s_e, n_e = micro_batch_loss_sum(eager, row, "chunked", max_segment=64, chunk_size=100)
        s_c.backward()
        assert n_c == n_e and torch.allclose(s_c, s_e, rtol=1e-5), (s_c.item(), s_e.item())
        if len(widths) == 1:
            first = len(graphs)
    assert len(widths) >= 4 and len(segments) >= 4
    assert first >= 1, "the compiled layers were not compiled"
    assert len(graphs) == first, f"{len(graphs) - first} recompile(s) for {len(widths)} row widths"
    torch._dynamo.reset()


def test_bucketed_rows_carry_no_labels_in_the_padding_and_keep_the_loss():
    """Rows rounded up to a bucket: the tail is padding (label -100, its own segments, not a real token), and the
    summed loss equals the exact-width row's."""
    model = _tiny(seed=9)
    use_packed_attention(model)
    recs = _records(6, 512, seed=10)
    total = sum(len(r.input_ids) for r in recs)
    exact = pack(recs, total, pad_id=0)
    bucket = pack(recs, 1024, pad_id=0, pad_multiple=256, max_segment=64)
    width = bucket["input_ids"].shape[1]
    assert exact["input_ids"].shape[1] == total and width % 256 == 0 and total < width <= 1024
    assert bucket["real_tokens"] == exact["real_tokens"] == total
    assert (bucket["labels"][0, total:] == -100).all() and (bucket["input_ids"][0, total:] == 0).all()
    assert int(bucket["cu_seq_lens"][-1]) == width and int(bucket["cu_seq_lens"][len(recs)]) == total
    assert bucket["max_length"] <= 64
    assert torch.equal(bucket["labels"][:, :total], exact["labels"])
    assert torch.equal(bucket["position_ids"][:, :total], exact["position_ids"])
    s_b, n_b = micro_batch_loss_sum(model, bucket, "chunked", max_segment=64, chunk_size=100)
    s_e, n_e = micro_batch_loss_sum(model, exact, "chunked", max_segment=64, chunk_size=100)
    assert n_b == n_e
    assert torch.allclose(s_b, s_e, rtol=1e-6), (s_b.item(), s_e.item())


# ------------------------------------------------------------------ planner


def test_token_budget_from_two_probes():
    gib = 2**30
    # fixed 20 GiB, 5 MiB per token, 100 GiB device, 10 GiB of optimizer states still to come
    per_tok = 5 * 2**20
    p = autobatch.plan_from_points([(2048, 20 * gib + 2048 * per_tok), (4096, 20 * gib + 4096 * per_tok)],
                                   100 * gib, 10 * gib, seq_len=2048, fraction=0.9)
    want = int((90 * gib - 30 * gib) // per_tok) // 128 * 128
    assert p.fits and p.tokens == want and abs(p.bytes_per_token - per_tok) < 1
    capped = autobatch.plan_from_points([(2048, 20 * gib + 2048 * per_tok), (4096, 20 * gib + 4096 * per_tok)],
                                        100 * gib, 10 * gib, seq_len=2048, fraction=0.9, max_tokens=8192)
    assert capped.tokens == 8192
    tight = autobatch.plan_from_points([(2048, 20 * gib + 2048 * per_tok), (4096, 20 * gib + 4096 * per_tok)],
                                       35 * gib, 10 * gib, seq_len=2048, fraction=0.9)
    assert not tight.fits and tight.tokens == 0  # not one 2048-token record: checkpointing is needed


GIB, MIB = 2**30, 2**20


def _fp8_full_peak(tokens: int) -> float:
    """A step's peak as the largest of two moments, as FP8 full fine-tuning of a 1.5B model measured on an H200: a
    moment that hardly grows with the row (the weights' FP8 casts) is the largest in rows of 1,024 and 2,048 tokens
    (9.88 and 9.93 GiB: 0.05 MiB a token between them); the activations' (1.6 MiB a token: 30.6 GiB at 16,384,
    56.2 at 32,768) from about 3,100 tokens on."""
    return max(9.83 * GIB + 0.05 * MIB * tokens, 5.08 * GIB + 1.6 * MIB * tokens)


H100_BYTES, STATES = 79.65 * GIB, 9.77 * GIB  # an H100's memory; that run's Adam states still to come


def test_a_plan_reaching_far_past_its_probes_is_measured_again_nearer_to_it():
    """On an H100 two small rows see only the flat moment and promise 65,536 tokens, which would need 117 GiB; the
    confirming probes (16,384: half the plan, at most 8 times the largest probe; then 26,624, three quarters of
    the next plan) find the activations' slope and size rows that fit in the fraction asked for."""
    fraction = 0.85
    two = autobatch.plan_from_points([(1024, _fp8_full_peak(1024)), (2048, _fp8_full_peak(2048))], H100_BYTES, STATES,
                                     1024, fraction)
    assert two.tokens == 65536 and _fp8_full_peak(two.tokens) + STATES > H100_BYTES  # the old plan: out of memory
    asked = []

    def measure(c):
        asked.append(c)
        return _fp8_full_peak(c)

    plan, points = autobatch.plan_by_probing(measure, 1024, H100_BYTES, STATES, fraction)
    assert asked == [1024, 2048, 16384, 25600] and [c for c, _ in points] == asked
    assert _fp8_full_peak(plan.tokens) + STATES <= fraction * H100_BYTES
    assert _fp8_full_peak(plan.tokens + 256) + STATES > fraction * H100_BYTES  # and not shorter than need be
    assert abs(plan.bytes_per_token - 1.6 * MIB) < 1


def test_memory_that_grows_evenly_is_confirmed_and_planned_the_same():
    def linear(c):
        return 20 * GIB + 5 * MIB * c

    asked = []
    plan, points = autobatch.plan_by_probing(lambda c: asked.append(c) or linear(c), 2048, 100 * GIB, 10 * GIB,
                                             0.9)
    # the plan (12,288) reaches past 4,096: half of it (6,144), then three quarters of it (8,192 in whole records)
    assert asked == [2048, 4096, 6144, 8192]
    assert plan.tokens == autobatch.plan_from_points([(2048, linear(2048)), (4096, linear(4096))], 100 * GIB,
                                                     10 * GIB, 2048, 0.9).tokens
    asked.clear()
    near, _ = autobatch.plan_by_probing(lambda c: asked.append(c) or linear(c), 4096, 100 * GIB, 10 * GIB, 0.9)
    assert asked == [4096, 8192] and near.tokens == plan.tokens  # within reach of the probes: no more
    far, far_points = autobatch.plan_by_probing(lambda c: 1 * GIB + 0.1 * MIB * c, 1024, 80 * GIB, 0.0)
    assert [c for c, _ in far_points] == [1024, 2048, 16384, 49152]  # the cap hides how far it reaches: measured
    assert far.tokens == 65536  # the confirming probes agree: the cap


def test_every_rank_runs_the_probes_any_rank_asks_for():
    """Under ZeRO a probe is a collective step: a rank whose own plan needs no confirming probe runs the one
    another rank asks for (agree gives the largest), and none runs where every rank agrees on none (0)."""
    asked = []

    def other_rank_wants(c):
        return max(c, 16384)  # another rank asks for a probe of 16,384 tokens

    autobatch.plan_by_probing(lambda c: asked.append(c) or 20 * GIB + 5 * MIB * c, 4096, 100 * GIB, 10 * GIB, 0.9,
                              agree=other_rank_wants)
    assert asked[:3] == [4096, 8192, 16384]
    asked.clear()
    autobatch.plan_by_probing(lambda c: asked.append(c) or _fp8_full_peak(c), 1024, H100_BYTES, STATES,
                              agree=lambda c: 0)
    assert asked == [1024, 2048]


def test_a_probe_that_runs_out_of_memory_bounds_the_rows():
    """A GPU of 24 GiB with FP8's memory: two small rows see only the flat moment (0.05 MiB a token) and promise
    65,536 tokens; the first confirming probe (16,384) runs out of memory. The next probe is halfway to it, and
    the rows are no longer than the largest probe that ran, which fits."""
    gpu, states = 24 * GIB, 2 * GIB
    asked = []

    def measure(c):
        asked.append(c)
        peak = _fp8_full_peak(c)
        return None if peak > gpu else peak

    plan, points = autobatch.plan_by_probing(measure, 1024, gpu, states, 0.85)
    assert asked == [1024, 2048, 16384, 9216] and [c for c, _ in points] == [1024, 2048, 9216]
    assert plan.fits and plan.ceiling == 16384 and plan.tokens <= 9216
    assert _fp8_full_peak(plan.tokens) + states <= 0.85 * gpu
    # where the probes that ran say the rows fit no further, their plan stands
    tight, _ = autobatch.plan_by_probing(measure, 1024, gpu, 8 * GIB, 0.85)
    assert tight.fits and tight.tokens < 9216 and _fp8_full_peak(tight.tokens) + 8 * GIB <= 0.85 * gpu


@pytest.mark.parametrize("runs_out_from, states, tokens, fits", [
    (1024, 0.0, 0, False),  # not even one record: the caller turns checkpointing on, or stops with its message
    (2048, 1 * GIB, 1024, True),  # one record and the optimizer's states fit: rows of one
    (2048, 15 * GIB, 0, False),  # one record runs, but the states would not fit beside it
])
def test_a_first_probe_that_runs_out_of_memory_says_what_fits(runs_out_from, states, tokens, fits):
    asked = []

    def measure(c):
        asked.append(c)
        return None if c >= runs_out_from else 10 * GIB + 1 * MIB * c

    plan, points = autobatch.plan_by_probing(measure, 1024, 24 * GIB, states, 0.85)
    assert (plan.tokens, plan.fits, plan.ceiling) == (tokens, fits, runs_out_from)
    assert asked == [1024, 2048][:len(points) + 1] and max(asked) == runs_out_from


def test_probe_plan_catches_a_probe_out_of_memory_only_where_it_runs_alone(monkeypatch):
    """probe_plan's own handling around the probes (CUDA's memory readings replaced: no GPU here; bench/probe_oom.py
    runs it against a real GPU's allocator): an out-of-memory error of a probe that waits on no other rank is caught,
    the gradients its backward made are dropped, and the plan stays under it; with a DeepSpeed engine or sequence
    parallelism (every rank agreeing on each probe) the error ends the run as before."""
    peak = {"now": 0.0}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: peak.update(now=0.0))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: peak["now"])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: SimpleNamespace(total_memory=24 * GIB))
    model = torch.nn.Linear(8, 8)

    def run_probe(tokens):
        model(torch.randn(2, 8)).sum().backward()  # gradients made before it runs out
        if _fp8_full_peak(tokens) > 24 * GIB:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        peak["now"] = _fp8_full_peak(tokens)
        model.zero_grad(set_to_none=True)

    plan = autobatch.probe_plan(model, run_probe, torch.device("cpu"), 1024)
    assert plan.fits and plan.ceiling == 16384 and plan.tokens <= 9216
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(torch.cuda.OutOfMemoryError):
        autobatch.probe_plan(model, run_probe, torch.device("cpu"), 1024, agree=lambda c: c)


def test_probes_out_of_order_are_refused():
    with pytest.raises(ValueError, match="each larger"):
        autobatch.plan_from_points([(2048, 1.0), (2048, 2.0)], 80 * GIB, 0.0, 1024)
    with pytest.raises(ValueError, match="two or more"):
        autobatch.plan_from_points([(2048, 1.0)], 80 * GIB, 0.0, 1024)


def _h200_plan(gib_2048: float, gib_4096: float, states_gib: float) -> "autobatch.Plan":
    gib = 2**30
    return autobatch.plan_from_points([(2048, gib_2048 * gib), (4096, gib_4096 * gib)], 139.8 * gib, states_gib * gib,
                                      seq_len=2048, fraction=0.9, max_tokens=49152)  # bench/train_speed.py's


def test_checkpointing_is_chosen_where_rows_would_be_short_and_it_at_least_doubles_them():
    """The probes of 7B full fine-tuning under ZeRO-3 on an H200 (run32/run33 logs): without checkpointing
    66.99/75.56 GiB at 2,048/4,096 tokens and 56.74 GiB of Adam states to come leave rows of ~2,400 tokens (30% MFU);
    with it, rows of ~46,000 (45% MFU). 7B LoRA's rows of ~18,000 tokens keep checkpointing off."""
    full_off = _h200_plan(66.99, 75.56, 56.74)
    full_on = _h200_plan(115.2 - 56.74 + 2048 * 0.23 / 1024, 115.2 - 56.74 + 4096 * 0.23 / 1024, 56.74)
    assert full_off.fits and full_off.tokens < autobatch.SHORT_ROW_TOKENS < full_on.tokens
    assert autobatch.worth_checkpointing(full_off)  # worth a second probe
    assert autobatch.worth_checkpointing(full_off, full_on)
    lora = _h200_plan(27.96, 40.24, 1.20)
    assert lora.tokens > autobatch.SHORT_ROW_TOKENS and not autobatch.worth_checkpointing(lora)
    # short rows that checkpointing cannot double: the recompute would cost more than it saves
    barely = autobatch.Plan(tokens=int(full_off.tokens * 1.5), bytes_per_token=1.0, fixed_bytes=0.0, fits=True)
    assert not autobatch.worth_checkpointing(full_off, barely)
    nothing = autobatch.Plan(tokens=0, bytes_per_token=1.0, fixed_bytes=0.0, fits=False)
    assert autobatch.worth_checkpointing(nothing) and autobatch.worth_checkpointing(nothing, barely)


@pytest.mark.parametrize("argv,short,expect", [
    ([], True, True),  # short rows, checkpointing doubles them: on
    ([], False, False),  # long rows: stays off
    (["--no_gradient_checkpointing"], True, False),  # the user said off and one record fits: stays off
])
def test_size_rows_turns_checkpointing_on_only_where_it_pays(monkeypatch, argv, short, expect):
    """size_rows probes again with checkpointing on the real tiny model, keeps it where worth_checkpointing says
    so and turns it back off where not. The probe itself measures CUDA memory (none here): it is replaced by the
    plans the H200 measured, chosen by whether the model is checkpointing at the time of the probe."""
    from training.args import parse_args
    from training.fast import apply
    from training.model.pretrained import checkpointing_is_on

    model = _tiny()
    off = _h200_plan(66.99, 75.56, 56.74) if short else _h200_plan(27.96, 40.24, 1.20)
    on = autobatch.Plan(tokens=46720, bytes_per_token=0.23 * 2**20, fixed_bytes=115.2 * 2**30, fits=True)
    assert off.fits
    probed = []

    def probe(*a, **k):
        probed.append(checkpointing_is_on(model))
        return on if checkpointing_is_on(model) else off

    monkeypatch.setattr(apply, "probe_tokens", probe)
    args = parse_args(["--model_name_or_path", "x", "--data_path", "y", "--output_dir", "z", *argv])
    fast = SimpleNamespace(auto_micro_batch=True, gradient_checkpointing=bool(args.train.gradient_checkpointing),
                           packing=False, attention="flash", packing_tokens=None)
    apply.size_rows(model, None, fast, {"vocab_size": 512}, torch.device("cpu"), None, model, given=args.fast,
                    train=args.train, max_length=args.data.model_max_length,
                    checkpointing_asked=args.train.gradient_checkpointing)
    assert fast.gradient_checkpointing is expect and checkpointing_is_on(model) is expect
    assert fast.packing_tokens == (on.tokens if expect else off.tokens)
    assert probed == ([False, True] if short and not argv else [False])


@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_the_memory_probe_runs_the_step_of_the_stage(monkeypatch, tiny_model, stage):
    """probe_tokens's two rows go through the loss module as its training rows do: for DPO, rows of one and two
    pairs of full-length answers through the DPO head (float32 log-probabilities, recomputed in the backward) and
    loss, not chat records through SFT's. Only the CUDA memory reading (none here) is left out: the probes run."""
    import contextlib

    from transformers import AutoModelForCausalLM

    from training.fast import apply
    from training.fast.preference import STATS, PreferenceLoss

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    use_packed_attention(model)
    length, vocab = 48, model.config.vocab_size
    module = (PreferenceLoss(model, "chunked", length, True, 0.1, "sigmoid", 0.0) if stage == "dpo"
              else apply.FastLoss(model, "chunked", length, True))
    heads, outputs, asked = [], [], {}
    if stage == "dpo":
        module.head_logps.register_forward_hook(lambda m, i, out: heads.append(out.shape[0]))
    module.register_forward_hook(lambda m, i, out: outputs.append(out))

    def measured(model, run_probe, device, seq_len, **kw):  # probe_plan without its CUDA memory reading
        asked.update(seq_len=seq_len, **kw)
        for tokens in (seq_len, 2 * seq_len):
            run_probe(tokens)
            assert all(p.grad is None for p in model.parameters())  # each probe's gradients dropped
        return autobatch.Plan(tokens=4 * seq_len, bytes_per_token=1.0, fixed_bytes=0.0, fits=True)

    monkeypatch.setattr(autobatch, "probe_plan", measured)
    before = torch.get_rng_state()
    plan = apply.probe_tokens(module, torch.device("cpu"), length, vocab, contextlib.nullcontext, 0.85, 65536)
    assert plan.tokens == 4 * asked["seq_len"] and torch.equal(torch.get_rng_state(), before)
    assert asked["fraction"] == 0.85 and asked["states_built"] is False
    if stage == "sft":
        assert asked["seq_len"] == length  # one full-length record is the smallest row
        assert heads == [] and [int(n) for _, n in outputs] == [length - 1, 2 * (length - 1)]
        return
    assert asked["seq_len"] == 2 * length  # a pair's two answers share a row: the smallest row is one pair
    # the DPO head on every supervised position of one pair, then two; the DPO loss and its reward sums
    assert heads == [2 * (length - 1), 4 * (length - 1)]
    assert [tuple(stats.shape) for _, stats in outputs] == [(len(STATS),), (len(STATS),)]
    assert all(torch.isfinite(loss) and loss > 0 for loss, _ in outputs)


LAZY_STATES = r"""
import json, os, torch, deepspeed
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
from training.fast.apply import _fp32_partitions_of, _torch_optimizer_of
from training.fast.autobatch import lazy_state_bytes
from training.runtime.unused_imports import skip_deepspeed_cpu_shm_op
skip_deepspeed_cpu_shm_op("cpu")  # as the worker does: no g++ build of an op training never calls
got = {}
for stage in (2, 3):  # one engine after the other in one process: the imports and the process group paid once
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage}}
    e, *_ = deepspeed.initialize(model=m, optimizer=torch.optim.AdamW(m.parameters(), lr=1e-3), config=cfg)
    opt, flats = _torch_optimizer_of(e), _fp32_partitions_of(e)
    out = {"before": lazy_state_bytes(opt, flats, count_host=True), "on_device": lazy_state_bytes(opt, flats)}
    loss = e(torch.randn(2, 16)).square().mean()
    e.backward(loss)
    e.step()
    out["after"] = lazy_state_bytes(opt, _fp32_partitions_of(e), count_host=True)
    got[stage] = out
    e.destroy()
print(json.dumps(got))
"""


def test_the_probe_counts_the_adam_states_the_engine_creates_at_its_first_step():
    """Under DeepSpeed the probes run after the engine is built, but torch's AdamW creates its two states per
    fp32 partition element only at the first step, and ZeRO-3 hands its partitions to the optimizer only inside
    the step. A full 7B fine-tune under ZeRO-3 ran out of memory on an H200 at the first step: the probes had
    missed 57 GiB. The count is every trainable element x 2 states x 4 bytes before the first step and nothing
    after; partitions in host memory (CPU here, an offloaded optimizer there) are not GPU memory. ZeRO-2 and
    ZeRO-3, each in an engine of its own."""
    import json
    import os
    import subprocess
    import sys

    from support.paths import ROOT
    from support.ports import free_port

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", LAZY_STATES], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    trainable = 16 * 32 + 32 + 32 * 4 + 4
    for stage in ("2", "3"):
        assert got[stage] == {"before": 2 * 4 * trainable, "on_device": 0, "after": 0}, (stage, got)


# ------------------------------------------------------------------ adapter input cast


def _decide(argv=(), device="cuda", deepspeed=False):
    return decide_for(argv, device, deepspeed)


def test_lora_input_cast_is_dropped_only_where_autocast_recasts_it():
    import training.fast.choice as fp

    real = fp._varlen_available
    fp._varlen_available = lambda: True  # decide() asks about packing too; this test is about the cast
    try:
        assert not _decide(argv=["--use_lora", "--bf16"]).lora_input_cast
        assert not _decide(argv=["--q_lora", "--use_lora", "--fp16"]).lora_input_cast
        assert _decide(argv=["--use_lora", "--bf16"], device="cpu").lora_input_cast  # CPU bf16 dropout rounds its scale
        assert _decide(argv=["--use_lora"]).lora_input_cast  # fp32: no autocast to cast back
        assert _decide(argv=["--use_lora", "--bf16"], deepspeed=True).lora_input_cast
        assert _decide(argv=["--use_lora", "--bf16", "--lora_input_cast"]).why["lora_input_cast"] == "as given"
        assert _decide(argv=["--use_lora", "--bf16", "--lora_input_cast"]).lora_input_cast
        assert not _decide(argv=["--use_lora", "--no_lora_input_cast"], device="cpu").lora_input_cast
        assert _decide(argv=["--bf16"]).why["lora_input_cast"] == "n/a: no adapters"
    finally:
        fp._varlen_available = real


def test_adapter_inputs_in_bf16_give_the_same_loss_and_gradients_under_autocast():
    """Without dropout the two are the same computation bit for bit: autocast casts the fp32 copy back to bf16
    before the matmul. (With dropout the same holds on CUDA, where ATen's dropout scales in fp32 and rounds
    once: bench/lora_input_cast_check.py measures it on the GPU.)"""
    from peft import LoraConfig, get_peft_model

    from training.fast.apply import set_lora_input_cast

    def run(cast: bool):
        model = _tiny(seed=3).to(torch.bfloat16)
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                                                  target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"]))
        for n, p in model.named_parameters():
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(5))
        assert next(p for n, p in model.named_parameters() if "lora_A" in n).dtype == torch.float32
        assert set_lora_input_cast(model, cast) == 2 * 4
        ids = torch.randint(0, 512, (2, 48), generator=torch.Generator().manual_seed(9))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    (l1, g1), (l2, g2) = run(True), run(False)
    assert l1 == l2 and g1.keys() == g2.keys() and len(g1) == 2 * 2 * 4
    assert all(torch.equal(g1[k], g2[k]) for k in g1)


# ------------------------------------------------------------------ varlen attention kernel


def test_attention_kernel_is_cudnn_only_where_it_can_run_with_bounded_plans(monkeypatch):
    import training.fast.choice as fp
    from training.fast.attention import cudnn_unfit
    from training.runtime.errors import InputError

    auto = _decide(argv=["--bf16"], device="cpu")
    assert auto.attention == "flash" and auto.why["attention_kernel"] == "n/a: no packed rows on CUDA"
    assert "attention flash" in auto.summary()
    assert "LoRA input cast n/a" in auto.summary()  # full fine-tuning: no adapters, whatever the field holds
    assert "LoRA input cast off" in _decide(argv=["--bf16", "--use_lora"]).summary()
    assert _decide(argv=["--attention_kernel", "flash"], device="cpu").why["attention_kernel"] == "as given"
    with pytest.raises(InputError, match="--attention_kernel cudnn needs a CUDA GPU"):
        _decide(argv=["--attention_kernel", "cudnn"], device="cpu")
    assert cudnn_unfit() == "no CUDA"  # this machine: the automatic choice never asks cuDNN for anything
    # A CUDA machine, as decide() sees it: varlen attention for packing, and cuDNN fit or not.
    monkeypatch.setattr(fp, "_varlen_available", lambda: True)
    monkeypatch.setattr(fp, "_cudnn_unfit", lambda: None)
    fit = _decide(argv=["--bf16", "--use_lora"])
    assert fit.attention == "cudnn" and fit.why["attention_kernel"].startswith("cudnn: Hopper GPU")
    assert _decide(argv=["--bf16", "--attention_kernel", "flash"]).attention == "flash"
    assert _decide(argv=["--bf16", "--no_packing"]).why["attention_kernel"] == "n/a: no packed rows on CUDA"
    for stage in (2, 3):  # ZeRO packs too
        assert decide_for(["--bf16"], "cuda", deepspeed=True, zero_stage=stage).attention == "cudnn"
    padded = decide_for(["--bf16", "--no_packing"], "cuda", deepspeed=True, zero_stage=3)
    assert padded.attention == "flash" and padded.why["attention_kernel"] == "n/a: no packed rows on CUDA"
    monkeypatch.setattr(fp, "_cudnn_unfit", lambda: "no nvidia-cudnn-frontend installed")
    unfit = _decide(argv=["--bf16", "--use_lora"])
    assert unfit.attention == "flash" and unfit.why["attention_kernel"] == "flash: no nvidia-cudnn-frontend installed"


def test_cudnn_takes_only_head_dimensions_it_was_measured_on():
    from training.fast.attention import cudnn_shape_unfit

    assert [cudnn_shape_unfit(d) for d in (16, 64, 128)] == [None, None, None]  # tiny, Qwen2.5-0.5B, the rest
    assert "not 100" in cudnn_shape_unfit(100) and "not 256" in cudnn_shape_unfit(256)


def test_cudnn_self_test_passes_an_agreeing_kernel_and_names_a_failing_or_wrong_one():
    """The self-test's logic with stand-in kernels (cuDNN needs a Hopper GPU): a kernel that agrees with the
    reference passes, one that raises or computes something else is named, and the kernel is left at flash."""
    import torch.nn.functional as F

    from training.fast import attention as att

    seen = []

    def reference(q, k, v, cu, bound, scale):  # exact causal attention per record, GQA by repetition
        seen.append(cu.tolist())
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        out = torch.zeros_like(q)
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
            if b > a:
                out[a:b] = F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1) for t in (q, k, v)),
                                                          is_causal=True, scale=scale).transpose(0, 1)
        return out

    def broken(*_):
        raise RuntimeError("cuDNN Frontend error: [cudnn_frontend] No valid engine configs\nmore")

    def skewed(q, k, v, cu, bound, scale):
        return reference(q, k, v, cu, bound, scale) * 1.2

    args = (4, 2, 16, torch.float32, torch.device("cpu"), 64)
    assert att.cudnn_self_test(*args, flash=reference, cudnn=reference) is None
    assert seen == [[0, 5, 22, 64, 128], [0, 5, 22, 64, 128] + [128] * 12]  # cuDNN gets the record count bucketed to 16
    why = att.cudnn_self_test(*args, flash=reference, cudnn=broken)
    assert why == "cuDNN's attention failed its self-test (RuntimeError: cuDNN Frontend error: [cudnn_frontend] " \
                  "No valid engine configs)"
    assert "disagrees with FlashAttention 2 in its self-test (output: 0.2 relative)" in \
        att.cudnn_self_test(*args, flash=reference, cudnn=skewed)
    assert att._kernel == "flash"


def test_the_fast_setup_gives_the_self_test_the_models_attention_shape():
    """The recipe's side of the automatic cuDNN choice (training.fast.apply), on CPU: the shape and dtype it hands
    over, and a self-test that cannot run here (no varlen kernel, no cuDNN) comes back as a reason, not an
    exception."""
    from support.worker import parsed_flags
    from training.fast import apply
    from training.fast.attention import cudnn_self_test

    seven = {"num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584}
    assert apply.attention_shape(seven) == (28, 4, 128)
    assert apply.attention_dtype(parsed_flags().train) == torch.bfloat16
    assert apply.attention_dtype(parsed_flags(["--fp16"]).train) == torch.float16
    qwen3 = {"num_attention_heads": 4, "hidden_size": 64, "head_dim": 32}  # Qwen3 sets head_dim itself
    assert apply.attention_shape(qwen3) == (4, 4, 32)
    got = cudnn_self_test(*apply.attention_shape(qwen3), torch.bfloat16, torch.device("cpu"), 2048)
    assert got.startswith("cuDNN's attention failed its self-test (")


def test_kernel_inputs_bucket_the_record_count_for_cudnn_only():
    from training.fast import attention as att

    assert [att.record_bucket(n) for n in (1, 16, 17, 33, 300)] == [16, 16, 32, 64, 512]
    cu = torch.tensor([0, 5, 9, 12], dtype=torch.int32)
    same, bound = att.kernel_inputs(cu, 5, 64)
    assert same is cu and bound == 64  # flash: the boundaries as they are, the constant bound
    with pytest.raises(ValueError, match="a segment of 80 tokens is longer than the bound 64"):
        att.kernel_inputs(cu, 80, 64)
    saved = att._kernel
    att._kernel = "cudnn"  # set_kernel("cudnn") would import the cudnn package, which CPU machines lack
    try:
        padded, bound = att.kernel_inputs(cu, 5, 64)
    finally:
        att._kernel = saved
    # 3 records become 16: the 13 added are empty (each ends where the last real one does).
    assert bound == 64 and padded.tolist() == [0, 5, 9, 12] + [12] * 13
    with pytest.raises(ValueError, match="unknown attention kernel 'fa3'"):
        att.set_kernel("fa3")


def test_cudnn_backward_plans_are_sized_for_the_widest_row():
    """bound_cudnn_totals on a stand-in for cudnn-frontend's torch_op module (the package needs a Hopper GPU;
    this checks the arithmetic, not cuDNN): every total up to the row budget maps to the budget's plan, a
    larger one keeps its own, binding again rebinds from the frontend's rounding, and a frontend that rounds
    differently is left alone."""
    from types import SimpleNamespace

    from training.fast.attention import bound_cudnn_totals

    def round64(n):
        return ((n + 63) // 64) * 64

    op = SimpleNamespace(_round64=round64)
    assert bound_cudnn_totals(17_024, torch_op=op)
    assert {op._round64(n) for n in (1, 128, 4_096, 16_000, 17_024)} == {17_024}
    assert op._round64(17_025) == 17_088  # wider than the budget: its own plan, as before
    assert bound_cudnn_totals(2_000, torch_op=op)  # a second run in the process: from the original rounding
    assert op._round64(100) == 2_048 and op._round64(4_000) == 4_032
    other = SimpleNamespace(_round64=lambda n: ((n + 127) // 128) * 128)
    assert not bound_cudnn_totals(17_024, torch_op=other) and other._round64(1) == 128
    assert not bound_cudnn_totals(17_024, torch_op=SimpleNamespace())
    changed = SimpleNamespace(_round64=lambda n, align: n)  # another signature: not the hook this was measured on
    assert not bound_cudnn_totals(17_024, torch_op=changed) and changed._round64(5, 1) == 5
