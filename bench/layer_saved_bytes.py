"""What one compiled decoder layer keeps for its backward, per token: the activation bytes the memory estimate
counts for full fine-tuning through the worker's compiled layers (qwen_tui/plan/estimate.py, `RunShape.compiled`).

    python bench/layer_saved_bytes.py --out bench/results/layer_saved_bytes-DATE-cpu.json   # CPU only, ~2 minutes
    python bench/layer_saved_bytes.py --device cuda --setups lora --out ...-DATE-GPU.json   # a GPU: Inductor itself

The worker compiles each decoder layer with Inductor, whose partition of the forward and backward graph (torch's
min-cut rematerialization) decides what is kept and what is recomputed. This runs the same partitioner on the CPU
with do-nothing compilers (no kernels built), on a Qwen2 layer of a real model's shape, and counts the bytes of
every tensor the compiled forward hands to the backward (a saved-tensors hook, each storage once) at two row widths:
the difference is what a token costs. Attention is an opaque operator that keeps what FlashAttention keeps (q, k, v,
its output and the log-sum-exp), as the worker's varlen kernel does. Two set-ups, as the worker runs full
fine-tuning: bf16 weights (under DeepSpeed), and fp32 weights under bf16 autocast (without it).

`lora` is peft's LoRA as the worker sets it up: adapters of rank 64 unless --lora-r, alpha 16, dropout 0.05, on all
seven projections, fp32 as peft makes them, on a frozen bf16 layer under bf16 autocast. `--device cuda` compiles
with Inductor itself (its random numbers drawn by ATen, as the worker has them). On an H100 (2026-12-06) LoRA kept
exactly what the CPU count says (7B 176,132 bytes a token a layer, 1.5B 81,668), and full fine-tuning less than it
(7B with bf16 weights 150,024 against 158,728; with fp32 weights under autocast 164,872 against 187,400): Inductor
recomputes more there than the partitioner alone decides.
"""


import argparse
import datetime
import functools
import json
import platform
import sys

SHAPES = {  # hidden, intermediate, attention heads, key-value heads, layers (Qwen2.5's configs)
    "7b": (3584, 18944, 28, 4, 28),
    "1.5b": (1536, 8960, 12, 2, 28),
}
SETUPS = ("bf16", "fp32-autocast")  # full fine-tuning
LORA_SETUPS = ("lora",)


def _register_attention():
    import torch
    from transformers import AttentionInterface, AttentionMaskInterface

    @torch.library.custom_op("layer_saved_bytes::attention", mutates_args=())
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rep = q.shape[1] // k.shape[1]
        out = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1),
                                                               v.repeat_interleave(rep, 1), is_causal=True)
        return out.contiguous(), q.new_zeros(q.shape[:3], dtype=torch.float32)

    @attention.register_fake
    def _(q, k, v):
        return q.new_empty(q.shape).contiguous(), q.new_empty(q.shape[:3], dtype=torch.float32)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs, *output)  # q, k, v, out, log-sum-exp: FlashAttention's

    def backward(ctx, grad_out, grad_lse):  # never run: only the forward's saved tensors are counted
        q, k, v, _, _ = ctx.saved_tensors
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    attention.register_autograd(backward, setup_context=setup_context)

    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        dtype = value.dtype if value.dtype != torch.float32 else torch.bfloat16  # the kernel takes bf16
        out, _ = attention(query.to(dtype), key.to(dtype), value.to(dtype))
        return out.transpose(1, 2), None

    AttentionInterface.register("saved_bytes", forward)
    AttentionMaskInterface.register("saved_bytes", lambda *a, **k: None)


def saved_bytes(shape: str, setup: str, tokens: int, device: str = "cpu", lora_r: int = 64) -> int:
    """Bytes the compiled layer keeps for backward in a row of `tokens` tokens (parameters not counted)."""
    import torch
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, inter, heads, kv_heads, _ = SHAPES[shape]
    torch._dynamo.reset()  # each count compiles a fresh layer: never past Dynamo's recompile limit (then eager)
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, num_hidden_layers=1, vocab_size=256, use_cache=False)
    cfg._attn_implementation = "saved_bytes"
    weights = torch.float32 if setup == "fp32-autocast" else torch.bfloat16
    model = Qwen2ForCausalLM(cfg).to(weights)
    if setup == "lora":
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=16, lora_dropout=0.05, target_modules=targets,
                                                 bias="none", task_type="CAUSAL_LM")).base_model.model
    model = model.to(device).train()
    layer, rotary = model.model.layers[0], model.model.rotary_emb
    if device == "cuda":
        import torch._inductor.config as inductor_config

        inductor_config.fallback_random = True  # as the worker compiles (training/fast/compile.py)
        backend = "inductor"
    else:
        partition = functools.partial(min_cut_rematerialization_partition, compiler="inductor")  # Inductor's

        def backend(gm, example):
            return aot_module_simplified(gm, example, fw_compiler=lambda g, _: g, bw_compiler=lambda g, _: g,
                                         partition_fn=partition)

    compiled = torch.compile(layer, backend=backend, dynamic=False)
    x = torch.randn(1, tokens, hidden, dtype=torch.bfloat16 if setup == "lora" else weights, device=device,
                    requires_grad=True)
    positions = torch.arange(tokens, device=device)[None]
    cos_sin = rotary(x, positions)
    seen: set = set()
    total = 0

    def pack(t):
        nonlocal total
        key = t.untyped_storage().data_ptr()
        if key and key not in seen and not isinstance(t, torch.nn.Parameter):
            seen.add(key)
            total += t.untyped_storage().nbytes()
        return t

    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=setup in ("fp32-autocast", "lora"))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        compiled(x, position_embeddings=cos_sin, attention_mask=None, position_ids=positions)
    return total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated (known: {', '.join(SHAPES)})")
    p.add_argument("--setups", default=",".join(SETUPS),
                   help=f"comma-separated (default {','.join(SETUPS)}; known: {', '.join(SETUPS + LORA_SETUPS)})")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: the partitioner with do-nothing compilers; cuda: Inductor itself (default cpu)")
    p.add_argument("--lora-r", type=int, default=64, help="the adapters' rank for the lora set-up (default 64)")
    p.add_argument("--tokens", default="64,128", help="the two row widths (default 64,128)")
    args = p.parse_args(argv)
    shapes, setups = args.shapes.split(","), args.setups.split(",")
    for name, known, given in (("--shapes", tuple(SHAPES), shapes), ("--setups", SETUPS + LORA_SETUPS, setups)):
        for x in given:
            if x not in known:
                p.error(f"{name}: unknown {x!r} (known: {', '.join(known)})")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU here")
    if args.device == "cpu":
        torch.set_num_threads(1)
    _register_attention()
    a, b = (int(t) for t in args.tokens.split(","))
    rows = []
    for shape in shapes:
        layers = SHAPES[shape][4]
        for setup in setups:
            counts = [saved_bytes(shape, setup, tokens, args.device, args.lora_r) for tokens in (a, b)]
            per_token = (counts[1] - counts[0]) / (b - a)
            rows.append({"shape": shape, "setup": setup, "device": args.device, "bytes_per_token_layer": per_token,
                         "mib_per_token_model": round(per_token * layers / 2**20, 3)}
                        | ({"lora_r": args.lora_r} if setup == "lora" else {}))
            print(f"{shape} {setup}: {per_token:,.0f} bytes a token a layer, {rows[-1]['mib_per_token_model']} MiB a "
                  f"token over {layers} layers", flush=True)
    if args.out:
        from importlib.metadata import version

        gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
        doc = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
               "machine": platform.machine(), "gpu": gpu, "torch": torch.__version__,
               "transformers": version("transformers"),
               "tokens": [a, b], "rows": rows}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
