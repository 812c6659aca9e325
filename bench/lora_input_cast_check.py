"""What --no_lora_input_cast changes on CUDA: adapter inputs kept in bf16 against peft's fp32 cast.

    python bench/lora_input_cast_check.py [--out FILE.json] [--compiled]

The worker's fast path turns peft's cast of each adapter's input to the fp32 adapter dtype off under CUDA
autocast (training.fast.choice, --lora_input_cast): autocast casts the dropped input back to bf16 for the
matmul anyway. Without dropout the two are the same computation, so the losses and gradients must be
identical. With dropout (0.05) the masks are drawn for a tensor of another dtype, so they differ (ATen's
kernel scales in fp32 and rounds once either way): the losses must stay close, and the adapter gradients
differ only as much as another draw of masks would make them. A small Qwen2 shape with LoRA r=64 on
every projection, three forward+backward passes from the same seeds, eagerly (and with --compiled, with
the decoder layers compiled as the worker compiles them). Exit 0 when both hold.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(cast: bool, dropout: float, compiled: bool, seed: int = 2, steps: int = 3):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from training.fast.apply import set_lora_input_cast
    from training.fast.compile import compile_decoder_layers

    cfg = Qwen2Config(vocab_size=4096, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                      num_attention_heads=16, num_key_value_heads=4, tie_word_embeddings=True, use_cache=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(model, LoraConfig(r=64, lora_alpha=16, lora_dropout=dropout, target_modules=targets,
                                             task_type="CAUSAL_LM"))
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.02)
    set_lora_input_cast(model, cast)
    if compiled:
        compile_decoder_layers(model)
    g = torch.Generator(device="cuda").manual_seed(1)
    losses = []
    torch.manual_seed(seed)  # the dropout masks
    for _ in range(steps):
        ids = torch.randint(0, cfg.vocab_size, (4, 512), device="cuda", generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
    grad = torch.cat([p.grad.float().flatten() for n, p in model.named_parameters() if p.grad is not None])
    return losses, grad


def compare(a, b) -> dict:
    (la, ga), (lb, gb) = a, b
    return {"losses": [la, lb], "max_loss_rel_diff": max(abs(x - y) / abs(y) for x, y in zip(la, lb)),
            "grad_rel_diff": float((ga - gb).norm() / gb.norm())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="also write the figures to this JSON file")
    p.add_argument("--compiled", action="store_true", help="also with the decoder layers compiled")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    report, ok = {}, True
    for compiled in (False, True) if args.compiled else (False,):
        mode = "compiled" if compiled else "eager"
        same = compare(run(False, 0.0, compiled), run(True, 0.0, compiled))
        drop = compare(run(False, 0.05, compiled), run(True, 0.05, compiled))
        # The yardstick for "another draw of masks": the cast path against itself with another dropout seed.
        redraw = compare(run(True, 0.05, compiled, seed=3), run(True, 0.05, compiled))
        report[mode] = {"dropout_0": same, "dropout_0.05": drop, "dropout_0.05_other_seed": redraw}
        ok &= same["max_loss_rel_diff"] == 0 and same["grad_rel_diff"] == 0
        ok &= drop["max_loss_rel_diff"] < 1e-3 and drop["grad_rel_diff"] < 2 * redraw["grad_rel_diff"]
        print(f"{mode}: dropout 0: loss diff {same['max_loss_rel_diff']:.2e}, gradient diff {same['grad_rel_diff']:.2e}"
              f" | dropout 0.05: loss diff {drop['max_loss_rel_diff']:.2e}, gradient diff {drop['grad_rel_diff']:.3f}"
              f" (another mask seed: {redraw['grad_rel_diff']:.3f})")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    print("as expected" if ok else "NOT as expected")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
