"""Advice for mixture-of-experts models (Qwen3-MoE, Qwen2-MoE): their pitfalls, with the numbers of this model.

MOE_QLORA          Q-LoRA cannot quantize experts stored fused (transformers 5): the worker refuses it
MOE_LORA_EXPERTS   LoRA on gate/up/down_proj adapts every expert: many times the attention's adapters (LoRA dropout
                   on the attention's adapters only: peft has none on fused experts)
MOE_ZERO3          ZeRO-3 gathers every expert of a layer at once (leaf modules, set by the worker) and moves the
                   whole model to every GPU each micro-batch, however few parameters a token uses
MOE_ROUTING        no capacity limit: routing imbalance costs speed, not tokens; the load-balancing loss, frozen
                   routers and the speed estimate's basis
"""

from __future__ import annotations

from collections.abc import Iterable

from ..base.levels import Level
from ..plan.estimate import GIB
from .core import Advice, Context, Fix, rule

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")


def _b(n: float) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _moe(c: Context) -> bool:
    return c.spec is not None and c.spec.is_moe


@rule
def moe_qlora(c: Context) -> Iterable[Advice]:
    if not _moe(c) or c.t.method != "qlora":
        return
    s = c.spec
    experts = s.moe_layers * s.experts * 3 * s.hidden * s.moe_intermediate
    yield Advice(Level.ERROR, "MOE_QLORA",
                 f"Q-LoRA of {c.t.model}: transformers stores its {s.experts} experts a layer fused as 3-D tensors, "
                 f"which bitsandbytes cannot quantize (it quantizes nn.Linear layers only), so {_b(experts)} of its "
                 f"{_b(s.total_params)} parameters would stay in 16 bits; the worker refuses it. LoRA on a bf16 base "
                 "sharded by ZeRO-3 trains it",
                 Fix("Use LoRA with ZeRO-3", {"training.method": "lora", "training.zero_stage": 3}))


@rule
def moe_lora_experts(c: Context) -> Iterable[Advice]:
    if not _moe(c) or c.t.method == "full":
        return
    targets = list(c.t.lora_target_modules or (*ATTENTION, *EXPERT_NAMES))
    if not any(t in EXPERT_NAMES for t in targets):
        return
    s, r = c.spec, c.t.lora_r
    try:
        all_params = s.lora_params(r, targets)
        attn = s.lora_params(r, [t for t in targets if t not in EXPERT_NAMES] or ATTENTION)
    except ValueError:
        return
    adam = all_params * 16 / GIB  # fp32 weights, gradients and two Adam moments
    names = ", ".join(t for t in targets if t in EXPERT_NAMES)
    what = (f"LoRA r{r} on {names} adapts all {s.experts} experts of every layer: {_b(all_params)} trainable "
            f"parameters, {all_params / max(attn, 1):.0f}x the attention's {_b(attn)} ({adam:.0f} GiB of fp32 "
            f"weights, gradients and Adam states before ZeRO shards them), of which a token trains "
            f"{s.experts_per_token}/{s.experts}")
    if c.t.lora_dropout > 0:
        # peft reaches fused experts through target_parameters, which has no dropout: the worker puts it on the
        # attention's adapters only, and says so in its log
        what += (f"; lora_dropout {c.t.lora_dropout:g} applies to the attention's adapters only (peft's LoRA on "
                 "fused experts has none)")
    yield Advice(Level.WARNING, "MOE_LORA_EXPERTS", what,
                 Fix("Adapt the attention only", {"training.lora_target_modules": ATTENTION}))


@rule
def moe_zero3(c: Context) -> Iterable[Advice]:
    if not _moe(c) or c.t.zero_stage != 3:
        return
    s = c.spec
    layer = 2 * s.largest_layer_params / GIB
    yield Advice(Level.INFO, "MOE_ZERO3",
                 f"ZeRO-3 on a mixture of experts: the worker makes every MoE layer one ZeRO-3 leaf module, so all "
                 f"{s.experts} experts of a layer ({layer:.1f} GiB in bf16) are gathered in one collective and ranks "
                 "whose tokens chose different experts never wait on each other's gathers (without it ZeRO-3 "
                 "stalls or crawls on these models); each micro-batch still brings the whole "
                 f"{_b(s.total_params)} parameters to every GPU, though a token uses {_b(s.active_params)}: "
                 "longer rows or more micro-batch per GPU spread that traffic over more tokens")


@rule
def moe_routing(c: Context) -> Iterable[Advice]:
    if not _moe(c):
        return
    s = c.spec
    yield Advice(Level.INFO, "MOE_ROUTING",
                 f"{s.experts} experts, {s.experts_per_token} a token, no capacity limit: no token is dropped, but "
                 "an imbalanced batch makes its busiest expert every GPU's slowest matmul. The worker adds the "
                 "routers' load-balancing loss (the config's router_aux_loss_coef, or --router_aux_loss_coef in "
                 "extra_args) on every path and logs it as aux_loss: a rising aux_loss is routing collapsing. The "
                 "routers stay frozen unless extra_args has --train_router. Step times count the "
                 f"{_b(s.active_matmul_params)} parameters a token multiplies at the efficiency the worker measured "
                 "on a mixture of experts (31.8% MFU on one H200, 0.6x the dense path)")
