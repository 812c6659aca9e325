"""A model's shape from its `config.json` alone: enough to count parameters and
estimate memory and FLOPs without weights, torch or a network.

`resolve_model(name)` understands a local model directory (reads its
config.json), `builtin:tiny` (and the worker's tiny MoE shapes) and hub ids of
known Qwen2/2.5/3 releases, dense and mixture-of-experts (tables below, so
`Qwen/Qwen2.5-72B-Instruct` or `Qwen/Qwen3-235B-A22B` resolves offline). Anything
else raises `UnknownModel`; callers turn that into an "unknown model" line
instead of a crash.

Parameter counts are exact for the Qwen2/2.5/3 architectures in transformers:
Qwen2 has biases on q/k/v; Qwen3 has none (unless `attention_bias`) but RMSNorms
on q and k per head (`q_norm`, `k_norm`); `head_dim` may differ from hidden/heads
(Qwen3). Tied embeddings count once.

Mixture of experts (Qwen3-MoE, Qwen2-MoE): a sparse layer's MLP is `experts`
SwiGLU experts of width `moe_intermediate` (transformers 5 stores them fused:
gate_up [E, 2m, h] and down [E, h, m]), a router [E, h], and in Qwen2-MoE a
shared expert of width `shared_intermediate` with a sigmoid gate [1, h]. Memory
counts every expert (`total_params`); a token runs `experts_per_token` of them,
so FLOPs count `active_matmul_params`. LoRA on gate/up/down_proj reaches every
expert (peft's target_parameters on the fused weights): E x r x (2h + 3m) a
layer, of which a token runs k/E.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

LORA_TARGETS_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class UnknownModel(ValueError):
    """The model's shape cannot be known here (no config.json, not in the table, or not a dense Qwen)."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied_embeddings: bool
    head_dim: int = 0  # 0 = hidden // heads
    qkv_bias: bool = True  # Qwen2/2.5: True; Qwen3: attention_bias (False)
    qk_norm: bool = False  # Qwen3
    o_bias: bool = False  # Qwen3 with attention_bias puts a bias on o_proj too
    quant_method: str | None = None  # quantization_config.quant_method ("gptq", "awq", "fp8", ...)
    quant_bits: int | None = None
    max_position: int | None = None
    architecture: str = "qwen2"
    # mixture of experts (0 = dense)
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0  # Qwen2-MoE's shared expert (0: none)
    moe_layers: int = 0  # sparse layers (the others have a dense MLP of `intermediate`)

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    # ---- dimensions
    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def quantized(self) -> bool:
        return self.quant_method is not None

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    # ---- parameter counts
    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each decoder projection (the LoRA targets). A mixture of experts' MLP
        names are one expert's (the shared expert's, when there is one, has its own width: _expert_lora)."""
        h = self.hidden
        i = self.moe_intermediate if self.is_moe else self.intermediate
        return {
            "q_proj": (h, self.q_dim), "k_proj": (h, self.kv_dim), "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
        }

    @property
    def _attention_linear(self) -> int:
        n = 2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim
        if self.qkv_bias:
            n += self.q_dim + 2 * self.kv_dim
        if self.o_bias:
            n += self.hidden
        return n

    def _moe_mlp(self, experts: int) -> int:
        """A sparse layer's MLP weights with `experts` routed experts counted (all, or a token's k)."""
        h = self.hidden
        n = experts * 3 * h * self.moe_intermediate + self.experts * h  # experts + router
        if self.shared_intermediate:
            n += 3 * h * self.shared_intermediate + h  # shared expert + its sigmoid gate
        return n

    @property
    def _decoder_linear(self) -> int:
        """Every decoder layer's projections (and q/k/v biases), experts and routers."""
        dense_mlp = 3 * self.hidden * self.intermediate
        if not self.is_moe:
            return self.layers * (self._attention_linear + dense_mlp)
        return (self.layers * self._attention_linear + self.moe_layers * self._moe_mlp(self.experts)
                + (self.layers - self.moe_layers) * dense_mlp)

    @property
    def layer_linear_params(self) -> int:
        """Weights (and q/k/v biases) of one decoder layer's projections (experts and routers included; the mean
        over the layers where some have a dense MLP): what a 4-bit base quantizes."""
        return self._decoder_linear // self.layers

    @property
    def layer_norm_params(self) -> int:
        n = 2 * self.hidden  # input_layernorm, post_attention_layernorm
        if self.qk_norm:
            n += 2 * self.head_dim
        return n

    @property
    def layer_params(self) -> int:
        return self.layer_linear_params + self.layer_norm_params

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        """Separate lm_head weights (0 when tied to the embedding)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        """Unique parameters, tied embeddings counted once (what transformers' num_parameters() says)."""
        return (self._decoder_linear + self.layers * self.layer_norm_params + self.embedding_params
                + self.lm_head_params + self.hidden)

    @property
    def active_params(self) -> int:
        """Parameters one token uses (the routed experts it picks, not the others), embeddings included: the
        'activated parameters' of Qwen's model cards (3.3B for Qwen3-30B-A3B)."""
        return self.total_params - self.layers_sparse_idle

    @property
    def layers_sparse_idle(self) -> int:
        """Expert weights a token does not run (0 for a dense model)."""
        if not self.is_moe:
            return 0
        return self.moe_layers * (self.experts - self.experts_per_token) * 3 * self.hidden * self.moe_intermediate

    @property
    def largest_layer_params(self) -> int:
        """Largest single module's own parameters, as DeepSpeed's ZeRO-3 estimator counts them. A mixture of
        experts' decoder layer is one ZeRO-3 leaf module in the worker (every expert gathered at once): the
        layer's parameters."""
        if self.is_moe:
            return self._attention_linear + self._moe_mlp(self.experts)
        own = [a * b + (b if (self.qkv_bias and n in ("q_proj", "k_proj", "v_proj"))
                        or (self.o_bias and n == "o_proj") else 0)
               for n, (a, b) in self.module_shapes().items()]
        return max(self.embedding_params, *own)

    @property
    def matmul_params(self) -> int:
        """Parameters that take part in a matmul: every projection (every expert) plus the lm_head (tied or
        not). Memory of weight copies; FLOPs use active_matmul_params."""
        return self._decoder_linear + self.vocab * self.hidden

    @property
    def active_matmul_params(self) -> int:
        """Parameters one token multiplies: the k experts it is routed to, not all of them (dense: matmul_params).
        3.04B for Qwen3-30B-A3B; MFU of a MoE run is counted on these."""
        return self.matmul_params - self.layers_sparse_idle

    @property
    def act_intermediate(self) -> int:
        """The MLP width a token's activations have: k experts of moe_intermediate (+ the shared expert)."""
        if not self.is_moe:
            return self.intermediate
        return self.experts_per_token * self.moe_intermediate + self.shared_intermediate

    def lora_params(self, r: int, targets: list[str] | None = None, active: bool = False) -> int:
        """Trainable LoRA parameters: r * (in + out) for each targeted projection of every layer. On a mixture of
        experts, gate/up/down_proj adapt every expert (and the shared expert); active=True counts the adapters
        one token runs (its k experts), for FLOPs."""
        shapes = self.module_shapes()
        names = list(targets) if targets else list(LORA_TARGETS_ALL)
        unknown = [t for t in names if t not in shapes]
        if unknown:
            raise ValueError(f"no modules named {', '.join(unknown)} in a {self.architecture} model")
        attn = [t for t in names if t not in ("gate_proj", "up_proj", "down_proj")]
        n = self.layers * sum(r * (shapes[t][0] + shapes[t][1]) for t in attn)
        mlp = [t for t in names if t in ("gate_proj", "up_proj", "down_proj")]
        if not mlp:
            return n
        if not self.is_moe:
            return n + self.layers * sum(r * (shapes[t][0] + shapes[t][1]) for t in mlp)
        return n + self._expert_lora(r, mlp, active)

    def _expert_lora(self, r: int, mlp: list[str], active: bool) -> int:
        h, m, s = self.hidden, self.moe_intermediate, self.shared_intermediate
        e = self.experts_per_token if active else self.experts
        # peft's LoRA on the fused weights: gate_up [E, 2m, h] is one target for gate_proj and up_proj
        routed = 0
        if "gate_proj" in mlp or "up_proj" in mlp:
            routed += e * r * (h + 2 * m)
        if "down_proj" in mlp:
            routed += e * r * (m + h)
        shared = sum(r * (h + s) for t in mlp) if s else 0
        dense = (self.layers - self.moe_layers) * sum(r * (h + self.intermediate) for t in mlp)
        return self.moe_layers * (routed + shared) + dense


# ---------------------------------------------------------------- from config.json

def spec_from_config(cfg: dict[str, Any], name: str = "model") -> ModelSpec:
    """Builds a ModelSpec from a transformers config dict (config.json). Raises UnknownModel."""
    mtype = str(cfg.get("model_type", "")).lower()
    if mtype and mtype not in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        raise UnknownModel(f"{name}: model_type {mtype!r} is not a Qwen2/2.5/3 model (dense or mixture of experts)")
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)  # transformers 5 writes the latter
    if experts and mtype not in ("qwen2_moe", "qwen3_moe"):
        raise UnknownModel(f"{name}: {experts} experts in a model_type {mtype!r} config: not a Qwen MoE model")
    base = mtype.removesuffix("_moe")
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        qwen3_bias = base == "qwen3" and bool(cfg.get("attention_bias", False))
        moe = _moe_fields(cfg, experts, int(cfg["num_hidden_layers"])) if experts else {}
        spec = ModelSpec(
            name=name,
            layers=int(cfg["num_hidden_layers"]),
            hidden=hidden,
            intermediate=int(cfg["intermediate_size"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            vocab=int(cfg["vocab_size"]),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # transformers' Qwen3Config defaults head_dim to 128, Qwen2 derives it
            head_dim=int(cfg.get("head_dim") or (128 if base == "qwen3" else hidden // heads)),
            # Qwen2 always has q/k/v biases, Qwen2-MoE as its config's qkv_bias says
            qkv_bias=bool(cfg.get("qkv_bias", True)) if base != "qwen3" else qwen3_bias,
            o_bias=qwen3_bias,
            qk_norm=base == "qwen3",
            max_position=cfg.get("max_position_embeddings"),
            architecture=mtype or "qwen2",
            **moe,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise UnknownModel(f"{name}: config.json lacks a usable {e}") from None
    q = cfg.get("quantization_config")
    if q:
        method = str(q.get("quant_method", "unknown")).lower()
        bits = q.get("bits") or (4 if q.get("load_in_4bit") else 8 if q.get("load_in_8bit") else None)
        spec = replace(spec, quant_method=method, quant_bits=int(bits) if bits else None)
    return spec


def _moe_fields(cfg: dict[str, Any], experts: int, layers: int) -> dict[str, int]:
    """The MoE fields of ModelSpec from a Qwen3-MoE / Qwen2-MoE config (which layers are sparse as transformers
    decides: not in mlp_only_layers, and (index + 1) a multiple of decoder_sparse_step)."""
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense = set(cfg.get("mlp_only_layers") or [])
    sparse = sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
    return dict(experts=experts, experts_per_token=int(cfg["num_experts_per_tok"]),
                moe_intermediate=int(cfg["moe_intermediate_size"]),
                shared_intermediate=int(cfg.get("shared_expert_intermediate_size") or 0), moe_layers=sparse)


# ---------------------------------------------------------------- known releases (offline)

@dataclass(frozen=True)
class _Shape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    arch: str = "qwen2"
    head_dim: int = 0


# From the releases' config.json files (Qwen2 and Qwen2.5 share shapes per size except where listed).
KNOWN: dict[str, _Shape] = {
    "qwen2.5-0.5b": _Shape(24, 896, 4864, 14, 2, 151936, True),
    "qwen2.5-1.5b": _Shape(28, 1536, 8960, 12, 2, 151936, True),
    "qwen2.5-3b": _Shape(36, 2048, 11008, 16, 2, 151936, True),
    "qwen2.5-7b": _Shape(28, 3584, 18944, 28, 4, 152064, False),
    "qwen2.5-14b": _Shape(48, 5120, 13824, 40, 8, 152064, False),
    "qwen2.5-32b": _Shape(64, 5120, 27648, 40, 8, 152064, False),
    "qwen2.5-72b": _Shape(80, 8192, 29568, 64, 8, 152064, False),
    "qwen2-0.5b": _Shape(24, 896, 4864, 14, 2, 151936, True),
    "qwen2-1.5b": _Shape(28, 1536, 8960, 12, 2, 151936, True),
    "qwen2-7b": _Shape(28, 3584, 18944, 28, 4, 152064, False),
    "qwen2-72b": _Shape(80, 8192, 29568, 64, 8, 152064, False),
    "qwen3-0.6b": _Shape(28, 1024, 3072, 16, 8, 151936, True, "qwen3", 128),
    "qwen3-1.7b": _Shape(28, 2048, 6144, 16, 8, 151936, True, "qwen3", 128),
    "qwen3-4b": _Shape(36, 2560, 9728, 32, 8, 151936, True, "qwen3", 128),
    "qwen3-8b": _Shape(36, 4096, 12288, 32, 8, 151936, False, "qwen3", 128),
    "qwen3-14b": _Shape(40, 5120, 17408, 40, 8, 151936, False, "qwen3", 128),
    "qwen3-32b": _Shape(64, 5120, 25600, 64, 8, 151936, False, "qwen3", 128),
}

def _moe(mtype: str, layers: int, hidden: int, heads: int, kv: int, experts: int, k: int, moe_i: int, dense_i: int,
         shared: int = 0) -> dict[str, Any]:
    cfg = {"model_type": mtype, "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
           "num_key_value_heads": kv, "head_dim": 128, "num_experts": experts, "num_experts_per_tok": k,
           "moe_intermediate_size": moe_i, "intermediate_size": dense_i, "vocab_size": 151936,
           "tie_word_embeddings": False, "decoder_sparse_step": 1, "mlp_only_layers": []}
    if shared:
        cfg["shared_expert_intermediate_size"] = shared
    return cfg


# Mixture-of-experts releases, from their config.json files: total / active parameters 30.5B / 3.3B,
# 235.1B / 22.2B, 57.4B / 14.2B.
KNOWN_MOE: dict[str, dict[str, Any]] = {
    "qwen3-30b-a3b": _moe("qwen3_moe", 48, 2048, 32, 4, 128, 8, 768, 6144),
    "qwen3-235b-a22b": _moe("qwen3_moe", 94, 4096, 64, 4, 128, 8, 1536, 12288),
    "qwen2-57b-a14b": _moe("qwen2_moe", 28, 3584, 28, 4, 64, 8, 2560, 18944, shared=20480),
}

# Release suffixes that do not change the shape; the quantized ones say how it is stored.
_SUFFIX = re.compile(
    r"(?P<base>qwen[0-9.]+-[0-9.]+b(-a[0-9.]+b)?)(?P<rest>(-instruct|-chat|-base|-coder|-thinking|-2507)*)"
    r"(-(?P<quant>gptq-int4|gptq-int8|awq|int4|int8|fp8|gguf))?$"
)
_QUANT = {"gptq-int4": ("gptq", 4), "gptq-int8": ("gptq", 8), "int4": ("gptq", 4), "int8": ("gptq", 8),
          "awq": ("awq", 4), "fp8": ("fp8", 8), "gguf": ("gguf", None)}

# training/model/tiny.py: hidden 64, 2 layers, 4 heads, 2 KV, vocab 1024, tied
TINY = _Shape(2, 64, 128, 4, 2, 1024, True)
# training/model/tiny.py's mixture-of-experts shapes: 8 experts of width 32, 2 a token
# (Qwen2-MoE's with a shared expert)
TINY_MOE = {
    "builtin:tiny-moe": {**_moe("qwen3_moe", 2, 64, 4, 2, 8, 2, 32, 128), "head_dim": 16, "vocab_size": 1024},
    "builtin:tiny-qwen2-moe": {**_moe("qwen2_moe", 2, 64, 4, 2, 8, 2, 32, 128, shared=64), "head_dim": 16,
                               "vocab_size": 1024},
}


def _from_shape(name: str, s: _Shape, quant: tuple[str, int | None] | None = None) -> ModelSpec:
    return ModelSpec(
        name=name, layers=s.layers, hidden=s.hidden, intermediate=s.intermediate, heads=s.heads,
        kv_heads=s.kv_heads, vocab=s.vocab, tied_embeddings=s.tied, head_dim=s.head_dim,
        qkv_bias=s.arch == "qwen2", qk_norm=s.arch == "qwen3", architecture=s.arch,
        quant_method=quant[0] if quant else None, quant_bits=quant[1] if quant else None,
    )


def known_spec(hub_id: str) -> ModelSpec | None:
    """Spec of a known Qwen release by hub id (`Qwen/Qwen2.5-7B-Instruct`, any case), or None."""
    short = hub_id.rsplit("/", 1)[-1].lower()
    m = _SUFFIX.match(short)
    if not m or (m.group("base") not in KNOWN and m.group("base") not in KNOWN_MOE):
        return None
    quant = _QUANT[m.group("quant")] if m.group("quant") else None
    if m.group("base") in KNOWN_MOE:
        spec = spec_from_config(KNOWN_MOE[m.group("base")], hub_id)
        return replace(spec, quant_method=quant[0], quant_bits=quant[1]) if quant else spec
    return _from_shape(hub_id, KNOWN[m.group("base")], quant)


def known_hub_ids() -> list[str]:
    """Hub ids of the known releases (their instruct models where there are any), for a model field's suggestions:
    dense sizes, then the mixture-of-experts ones."""
    def hub(base: str) -> str:  # qwen2.5-7b -> Qwen/Qwen2.5-7B-Instruct; Qwen3's releases have no suffix
        name = "Qwen" + base.removeprefix("qwen").upper()
        return f"Qwen/{name}" + ("" if base.startswith("qwen3") else "-Instruct")

    moe = ["Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B-Instruct-2507",
           "Qwen/Qwen3-235B-A22B", "Qwen/Qwen2-57B-A14B-Instruct"]
    return [hub(b) for b in KNOWN] + moe


def resolve_model(name: str, base_dir: str | None = None) -> ModelSpec:
    """The spec of `name`: builtin:tiny (or a tiny MoE), a local directory with config.json, or a known hub id.

    Raises UnknownModel otherwise. Reads at most one small file; imports nothing heavy.
    """
    if name == "builtin:tiny":
        return _from_shape(name, TINY)
    if name in TINY_MOE:
        return spec_from_config(TINY_MOE[name], name)
    if name.startswith("builtin:"):
        raise UnknownModel(f"{name}: unknown built-in model")
    p = Path(name).expanduser()
    if base_dir and not p.is_absolute():
        p = Path(base_dir) / p
    cfg_path = p / "config.json" if p.is_dir() else p if p.name.endswith(".json") and p.is_file() else None
    if cfg_path is not None and cfg_path.is_file():
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UnknownModel(f"{name}: cannot read {cfg_path}: {e}") from None
        if not isinstance(cfg, dict):
            raise UnknownModel(f"{name}: {cfg_path} is not a JSON object")
        return spec_from_config(cfg, name)
    spec = known_spec(name)
    if spec is None:
        raise UnknownModel(f"{name}: unknown model (no config.json here and not a known Qwen release)")
    return spec
