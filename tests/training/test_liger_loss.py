"""The worker's Liger path (training.fast.loss, impl="liger") on CPU, through Triton's interpreter: Liger's
fused linear cross-entropy in the chunks the worker asks for gives the loss and gradients of full logits, on
every position or on the supervised ones only. (Liger is a CUDA library; the interpreter runs its Triton
kernels on CPU tensors, slowly, so the shapes are small.) Also bench/loss_variants.py's CPU smoke run, the
side-by-side benchmark of these switches."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from support.paths import ROOT
from support.worker import run_interpreted

_INTERPRETED = textwrap.dedent("""
    import json, os
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import torch.nn.functional as F
    import liger_kernel.ops.fused_linear_cross_entropy as LF
    from training.fast import loss as L

    seen = []  # the chunk budget each of Liger's forwards was given
    real_forward = LF.fused_linear_cross_entropy_forward

    def spy(*args, **kwargs):
        seen.append(kwargs.get("chunk_mem_const"))
        return real_forward(*args, **kwargs)

    LF.fused_linear_cross_entropy_forward = spy

    def rel(a, b):
        return ((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item()

    out = []
    for rows, chunk_rows, trainable_w in [(300, "64", True), (300, "64", False), (300, "0", True), (45, "64", True)]:
        os.environ["TRAINING_LIGER_CHUNK_ROWS"] = chunk_rows
        g = torch.Generator().manual_seed(rows + len(chunk_rows))
        h = torch.randn(rows, 64, generator=g, requires_grad=True)
        w = (torch.randn(1000, 64, generator=g) * 0.1).requires_grad_(trainable_w)
        t = torch.randint(0, 1000, (rows,), generator=g)
        t[::3] = -100
        got = L.targets_cross_entropy_sum(h, w, t, impl="liger")
        gh, *gw = torch.autograd.grad(got * 0.5, [h] + ([w] if trainable_w else []))
        ref = F.cross_entropy(h @ w.t(), t, ignore_index=-100, reduction="sum")
        rh, *rw = torch.autograd.grad(ref * 0.5, [h] + ([w] if trainable_w else []))
        out.append(dict(rows=rows, chunk_rows=chunk_rows, w=trainable_w, loss=rel(got, ref), dh=rel(gh, rh),
                        dw=rel(gw[0], rw[0]) if trainable_w else 0.0, given=seen[-1],
                        budget=L.liger_chunk_budget(rows, 1000, 64, int(chunk_rows) or 1)))
    # The supervised positions of a (B, T) batch only, against the head on every position.
    os.environ["TRAINING_LIGER_CHUNK_ROWS"] = "64"
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(2, 90, 64, generator=g, requires_grad=True)
    w = torch.randn(1000, 64, generator=g) * 0.1
    labels = torch.randint(0, 1000, (2, 90), generator=g)
    labels[:, :30] = -100
    target = L.shift_labels(labels).reshape(-1)
    pos = (target != -100).nonzero().squeeze(1)
    s_sel, n_sel = L.labelled_cross_entropy_sum(hidden, w, pos, target[pos], impl="liger")
    (g_sel,) = torch.autograd.grad(s_sel, [hidden])
    s_all, n_all = L.linear_cross_entropy_sum(hidden, w, labels, impl="liger")
    (g_all,) = torch.autograd.grad(s_all, [hidden])
    print(json.dumps(dict(cases=out, labelled=dict(loss=rel(s_sel, s_all), dh=rel(g_sel, g_all),
                                                   n=[int(n_sel), int(n_all)]))))
""")


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_INTERPRETED)


def test_liger_in_our_chunks_gives_the_full_logits_loss_and_gradients(interpreted):
    for c in interpreted["cases"]:
        assert c["loss"] < 1e-5 and c["dh"] < 1e-5 and c["dw"] < 1e-5, c
        # Liger got the worker's budget; with TRAINING_LIGER_CHUNK_ROWS=0 its own default (1)
        assert c["given"] == (c["budget"] if c["chunk_rows"] != "0" else 1), c
    # 300 rows in chunks of at most 64: the budget cuts Liger's work into at least 5 chunks (1000 / (3 x 64) -> 6)
    assert interpreted["cases"][0]["budget"] == 3


def test_liger_on_supervised_positions_only_matches_every_position(interpreted):
    lab = interpreted["labelled"]
    assert lab["loss"] < 1e-5 and lab["dh"] < 1e-5
    assert lab["n"][0] == lab["n"][1] == 2 * 60  # in each row, positions 29..88 predict the labels 30..89


@pytest.mark.parametrize("vocab,hidden", [(152064, 3584), (151936, 1536), (151936, 896), (152064, 5120)])
def test_chunk_budget_gives_liger_chunks_of_at_most_the_rows_asked_for(vocab, hidden):
    """Liger's own rule (liger_kernel.ops.fused_linear_cross_entropy): n = ceil(V / (budget H)) chunks of
    next_pow2(ceil(rows / n)) rows, at most all the rows. Qwen2.5's vocabularies and hidden sizes (7B, 1.5B,
    0.5B, 14B): chunks of at most 2,048 rows, and the two memory probes (2,047 and 4,094 supervised positions
    of 2,048- and 4,096-token rows) both get chunks of 2,048 rows."""
    from training.fast.loss import liger_chunk_budget

    def chunk(rows):
        budget = liger_chunk_budget(rows, vocab, hidden, 2048)
        n = -(-vocab // (budget * hidden))
        size = 1
        while size < -(-rows // n):
            size *= 2
        return min(size, rows)

    assert max(chunk(r) for r in range(1, 60000, 97)) <= 2048
    assert chunk(4094) == 2048 and chunk(2047) == 2047
    assert chunk(17024) == 2048 and chunk(11000) == 2048


def test_loss_variants_bench_runs_every_variant_on_the_same_steps(tmp_path):
    """bench/loss_variants.py's CPU smoke run (tiny shape, chunked loss): every variant runs every round on the
    same records, and on the same first row the variants' losses agree."""
    out = tmp_path / "lv.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "loss_variants.py"), "--device", "cpu", "--shape",
                           "tiny", "--ce", "chunked", "--no-compile", "--tokens", "1024", "--rounds", "2",
                           "--records-per-step", "8", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["results"]) == {"now", "alllogits", "ligerchunks", "before"}
    assert all(len(r["steps"]) == 2 and r["tokens_per_s"] > 0 for r in res["results"].values())
    checks = res["first_row_check"]
    assert len({c["labelled"] for c in checks.values()}) == 1 and checks["now"]["labelled"] > 0
    assert res["first_row_max_rel_diff"] < 1e-5
    assert "vs before" in proc.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "loss_variants.py"), "--variants", "now,fastest"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown variant(s) fastest" in bad.stderr
