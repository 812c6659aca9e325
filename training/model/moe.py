"""Mixture-of-experts Qwen (Qwen3-MoE, Qwen2-MoE) in the worker.

The load-balancing loss. Every sparse MoE block's router picks `num_experts_per_tok` of `num_experts` experts for
each token; Switch Transformer's auxiliary loss (transformers' load_balancing_loss_func) pushes the routing towards
using every expert alike. transformers adds it to the loss only inside the causal LM's forward; the fast path runs
the decoder and computes the loss itself, so RouterAux collects the routers' logits with forward hooks (on every
path, fast or not) and the recipe adds `coef x aux` to the loss of each micro-batch:

    aux(micro-batch) = num_experts x sum_e f_e x P_e   over the micro-batch's real tokens and all MoE layers
    (f_e: share of the top-k picks that went to expert e; P_e: mean router probability of e), as transformers
    computes it with an attention mask, so a packed row and the same records padded give the same value;
    step objective = cross-entropy (per supervised token of the step) + coef x sum over micro-batches of
    aux(micro-batch) x its real tokens / the step's real tokens (over every rank).

The token weighting makes the aux term of a step the same whatever the micro-batch count, and it weighs each
rank's micro-batches by what they hold, as the cross-entropy's normalisation does. metrics.jsonl logs the weighted
aux (without the coefficient) as `aux_loss` beside the cross-entropy `loss`.

Expert layouts. transformers 5 stores a block's experts fused, as 3-D parameters (`experts.gate_up_proj`,
`experts.down_proj`); transformers 4 as a ModuleList of MLPs with gate_proj/up_proj/down_proj. LoRA reaches the
fused experts through peft's `target_parameters`, the listed ones through the usual module names. bitsandbytes
quantizes nn.Linear layers only, so 4-bit Q-LoRA cannot quantize fused experts (refused: training.model).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch

log = logging.getLogger("training")

MOE_TYPES = ("qwen3_moe", "qwen2_moe")
MLP_NAMES = ("gate_proj", "up_proj", "down_proj")
# peft target_parameters of the fused experts, by the projection names users give
FUSED_TARGETS = {"gate_proj": "mlp.experts.gate_up_proj", "up_proj": "mlp.experts.gate_up_proj",
                 "down_proj": "mlp.experts.down_proj"}
ROUTER_KEY = "mlp.gate"  # the router of a sparse block (Qwen2-MoE's mlp.shared_expert_gate is not one)


@dataclass(frozen=True)
class MoeShape:
    num_experts: int
    top_k: int
    aux_coef: float
    shared_expert: bool


def moe_shape(config: dict) -> MoeShape | None:
    """The MoE part of a config.json (None for a dense model). transformers 5 writes `num_local_experts`, the
    released configs `num_experts`."""
    experts = config.get("num_experts") or config.get("num_local_experts")
    if not experts:
        return None
    return MoeShape(num_experts=int(experts), top_k=int(config.get("num_experts_per_tok") or 1),
                    aux_coef=float(config.get("router_aux_loss_coef") or 0.0),
                    shared_expert=bool(config.get("shared_expert_intermediate_size")))


def sparse_blocks(model) -> list[torch.nn.Module]:
    """The sparse MoE blocks (a router `gate` beside `experts`) of a model, through a peft wrapper."""
    return [m for m in model.modules() if hasattr(m, "gate") and hasattr(m, "experts")]


def expert_layout(model) -> str:
    """'fused' (3-D expert parameters, transformers 5), 'modules' (one MLP module per expert) or 'none'."""
    blocks = sparse_blocks(model)
    if not blocks:
        return "none"
    # a peft wrapper of fused experts (ParamWrapper) holds the 3-D weights one level down
    return "fused" if any(len(getattr(p, "ds_shape", p.shape)) == 3 for p in blocks[0].experts.parameters()) \
        else "modules"


def layout_of_config(config: dict) -> str:
    """expert_layout of the model this config builds, found on the meta device (no memory, any size)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    skip = ("architectures", "transformers_version")
    cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k not in skip})
    # layers up to the first sparse one tell the layout (transformers' rule: not in mlp_only_layers, and the
    # index + 1 a multiple of decoder_sparse_step)
    dense, step = set(config.get("mlp_only_layers") or []), int(config.get("decoder_sparse_step") or 1)
    total = int(config.get("num_hidden_layers") or 1)
    cfg.num_hidden_layers = next((i + 1 for i in range(total) if i not in dense and (i + 1) % step == 0), total)
    with torch.device("meta"):
        return expert_layout(AutoModelForCausalLM.from_config(cfg))


def lora_targets(model, names: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(target_modules, target_parameters, names no module or expert parameter answers to) for LoRA on `names`.
    With fused experts, gate_proj/up_proj/down_proj also reach the experts' 3-D weights (peft's
    target_parameters); the modules of those names elsewhere (Qwen2-MoE's shared expert, dense MLP layers) stay
    targets too."""
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    fused = expert_layout(model) == "fused"
    modules = [n for n in names if n in present]
    params = sorted({FUSED_TARGETS[n] for n in names if fused and n in FUSED_TARGETS})
    unknown = [n for n in names if n not in present and not (fused and n in FUSED_TARGETS)]
    return modules, params, unknown


def set_router_trainable(model, trainable: bool) -> int:
    """requires_grad of every router's weights; returns how many parameters."""
    n = 0
    for block in sparse_blocks(model):
        for p in block.gate.parameters():
            p.requires_grad_(trainable)
            n += 1
    return n


def zero3_leaf_types(model) -> list[type]:
    """The sparse MoE block classes, for deepspeed.utils.set_z3_leaf_modules."""
    return sorted({type(b) for b in sparse_blocks(model)}, key=lambda t: t.__name__)


def load_balancing_loss(logits: list[torch.Tensor], num_experts: int, top_k: int,
                        mask: torch.Tensor | None = None) -> torch.Tensor:
    """transformers' load_balancing_loss_func over the router logits of every MoE layer ((tokens, experts) each),
    with mask (tokens,) selecting the real tokens; float32. No token: 0 that still reaches the graph."""
    dev = logits[0].device
    counts = torch.zeros(num_experts, dtype=torch.float32, device=dev)
    probs = torch.zeros(num_experts, dtype=torch.float32, device=dev)
    rows = torch.zeros((), dtype=torch.float32, device=dev)
    w = mask.reshape(-1).to(device=dev, dtype=torch.float32) if mask is not None else None
    for layer in logits:
        p = torch.softmax(layer.float(), dim=-1)
        _, picked = torch.topk(p, top_k, dim=-1)
        ww = w if w is not None else torch.ones(p.shape[0], dtype=torch.float32, device=dev)
        counts = counts.scatter_add(0, picked.reshape(-1), ww.repeat_interleave(top_k))
        probs = probs + (p * ww.unsqueeze(-1)).sum(dim=0)
        rows = rows + ww.sum()
    rows = rows.clamp(min=1.0)  # an empty row of padding: counts and probs are zeros
    return torch.sum((counts / rows) * (probs / rows)) * num_experts


def real_token_mask(batch: dict) -> tuple[torch.Tensor, int | torch.Tensor]:
    """(mask of the real tokens, their number) of a packed row (its records fill it from the start; the number
    known on the host) or a padded batch (its attention mask; the number on the device, not read back)."""
    if "cu_seq_lens" in batch:
        n = int(batch["real_tokens"])
        ids = batch["input_ids"]
        return torch.arange(ids.numel(), device=ids.device) < n, n
    mask = batch["attention_mask"].reshape(-1)
    return mask.bool(), mask.sum().float()


class RouterAux:
    """Forward hooks on every router that keep its logits while collecting() is active (not while gradient
    checkpointing recomputes a layer in the backward, nor in evaluation), and the aux loss from them.

    Each router's logits are kept on that router (an attribute), not appended to one list: the decoder layers are
    compiled once for all layers (training.fast.compile), and a list that grows layer by layer is a guard that
    fails in every layer (a recompile each, until torch gives up compiling the rest)."""

    ATTR = "_aux_router_logits"

    def __init__(self, model, shape: MoeShape, coef: float):
        self.shape = shape
        self.coef = coef
        self.active = False
        self.gates = [b.gate for b in sparse_blocks(model)]
        self.handles = [g.register_forward_hook(self._keep) for g in self.gates]
        self.layers = len(self.gates)

    def _keep(self, module, args, output) -> None:
        if self.active:
            setattr(module, self.ATTR, output[0] if isinstance(output, tuple) else output)

    def _clear(self) -> list:
        kept = [g.__dict__.pop(self.ATTR, None) for g in self.gates]
        return [x for x in kept if x is not None]

    @contextlib.contextmanager
    def collecting(self):
        self._clear()
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def aux(self, mask: torch.Tensor | None) -> torch.Tensor:
        """The aux loss of the micro-batch just run (and forgets its logits)."""
        logits = self._clear()
        if len(logits) != self.layers:
            raise RuntimeError(f"router logits of {len(logits)} MoE layers collected, the model has {self.layers}")
        return load_balancing_loss(logits, self.shape.num_experts, self.shape.top_k, mask)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def layer_numel(config: dict) -> int | None:
    """Parameters of one MoE decoder layer (attention, every expert, shared expert, router), None for a dense
    model: what ZeRO-3 gathers at once with a decoder layer as its leaf module."""
    shape = moe_shape(config)
    if shape is None:
        return None
    h = int(config.get("hidden_size") or 4096)
    heads = int(config.get("num_attention_heads") or 32)
    hd = int(config.get("head_dim") or h // heads)
    kv = int(config.get("num_key_value_heads") or heads) * hd
    attn = h * (heads * hd + 2 * kv) + heads * hd * h
    experts = shape.num_experts * 3 * h * int(config.get("moe_intermediate_size") or 0)
    shared = 3 * h * int(config.get("shared_expert_intermediate_size") or 0)
    return attn + experts + shared + shape.num_experts * h
