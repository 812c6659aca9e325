"""A model's shape from its `config.json` alone: enough to count parameters and
estimate memory and FLOPs without weights, torch or a network.

`resolve_model(name)` understands a local model directory (reads its
config.json), `builtin:tiny` (the worker's training/tiny.py shape) and hub ids of
known dense Qwen2/2.5/3 releases (a table below, so `Qwen/Qwen2.5-72B-Instruct`
resolves offline). Anything else raises `UnknownModel`; callers turn that into
an "unknown model" line instead of a crash.

Parameter counts are exact for the dense Qwen2/2.5/3 architectures in
transformers: Qwen2 has biases on q/k/v; Qwen3 has none (unless
`attention_bias`) but RMSNorms on q and k per head (`q_norm`, `k_norm`);
`head_dim` may differ from hidden/heads (Qwen3). Tied embeddings count once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

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
    quant_method: Optional[str] = None  # quantization_config.quant_method ("gptq", "awq", "fp8", ...)
    quant_bits: Optional[int] = None
    max_position: Optional[int] = None
    architecture: str = "qwen2"

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

    # ---- parameter counts
    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each decoder projection (the LoRA targets)."""
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, self.q_dim), "k_proj": (h, self.kv_dim), "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
        }

    @property
    def layer_linear_params(self) -> int:
        """Weights (and q/k/v biases) of one decoder layer's projections: what a 4-bit base quantizes."""
        n = sum(a * b for a, b in self.module_shapes().values())
        if self.qkv_bias:
            n += self.q_dim + 2 * self.kv_dim
        if self.o_bias:
            n += self.hidden
        return n

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
        return self.layers * self.layer_params + self.embedding_params + self.lm_head_params + self.hidden

    @property
    def largest_layer_params(self) -> int:
        """Largest single module's own parameters, as DeepSpeed's ZeRO-3 estimator counts them."""
        own = [a * b + (b if (self.qkv_bias and n in ("q_proj", "k_proj", "v_proj"))
                        or (self.o_bias and n == "o_proj") else 0)
               for n, (a, b) in self.module_shapes().items()]
        return max(self.embedding_params, *own)

    @property
    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token: every projection plus the lm_head (tied or not)."""
        return self.layers * self.layer_linear_params + self.vocab * self.hidden

    def lora_params(self, r: int, targets: Optional[list[str]] = None) -> int:
        """Trainable LoRA parameters: r * (in + out) for each targeted projection of every layer."""
        shapes = self.module_shapes()
        names = list(targets) if targets else list(LORA_TARGETS_ALL)
        unknown = [t for t in names if t not in shapes]
        if unknown:
            raise ValueError(f"no modules named {', '.join(unknown)} in a {self.architecture} model")
        return self.layers * sum(r * (shapes[t][0] + shapes[t][1]) for t in names)


# ---------------------------------------------------------------- from config.json

def spec_from_config(cfg: dict[str, Any], name: str = "model") -> ModelSpec:
    """Builds a ModelSpec from a transformers config dict (config.json). Raises UnknownModel."""
    mtype = str(cfg.get("model_type", "")).lower()
    if mtype and mtype not in ("qwen2", "qwen3"):
        raise UnknownModel(f"{name}: model_type {mtype!r} is not a dense Qwen2/2.5/3 model")
    if cfg.get("num_experts") or cfg.get("num_local_experts"):
        raise UnknownModel(f"{name}: mixture-of-experts models are not estimated")
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        qwen3_bias = mtype == "qwen3" and bool(cfg.get("attention_bias", False))
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
            head_dim=int(cfg.get("head_dim") or (128 if mtype == "qwen3" else hidden // heads)),
            qkv_bias=True if mtype != "qwen3" else qwen3_bias,  # Qwen2 always has q/k/v biases
            o_bias=qwen3_bias,
            qk_norm=mtype == "qwen3",
            max_position=cfg.get("max_position_embeddings"),
            architecture=mtype or "qwen2",
        )
    except (KeyError, TypeError, ValueError) as e:
        raise UnknownModel(f"{name}: config.json lacks a usable {e}") from None
    q = cfg.get("quantization_config")
    if q:
        method = str(q.get("quant_method", "unknown")).lower()
        bits = q.get("bits") or (4 if q.get("load_in_4bit") else 8 if q.get("load_in_8bit") else None)
        spec = replace(spec, quant_method=method, quant_bits=int(bits) if bits else None)
    return spec


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

# Release suffixes that do not change the shape; the quantized ones say how it is stored.
_SUFFIX = re.compile(
    r"(?P<base>qwen[0-9.]+-[0-9.]+b)(?P<rest>(-instruct|-chat|-base|-coder)*)"
    r"(-(?P<quant>gptq-int4|gptq-int8|awq|int4|int8|fp8|gguf))?$"
)
_QUANT = {"gptq-int4": ("gptq", 4), "gptq-int8": ("gptq", 8), "int4": ("gptq", 4), "int8": ("gptq", 8),
          "awq": ("awq", 4), "fp8": ("fp8", 8), "gguf": ("gguf", None)}

TINY = _Shape(2, 64, 128, 4, 2, 1024, True)  # training/tiny.py: hidden 64, 2 layers, 4 heads, 2 KV, vocab 1024, tied


def _from_shape(name: str, s: _Shape, quant: Optional[tuple[str, Optional[int]]] = None) -> ModelSpec:
    return ModelSpec(
        name=name, layers=s.layers, hidden=s.hidden, intermediate=s.intermediate, heads=s.heads,
        kv_heads=s.kv_heads, vocab=s.vocab, tied_embeddings=s.tied, head_dim=s.head_dim,
        qkv_bias=s.arch == "qwen2", qk_norm=s.arch == "qwen3", architecture=s.arch,
        quant_method=quant[0] if quant else None, quant_bits=quant[1] if quant else None,
    )


def known_spec(hub_id: str) -> Optional[ModelSpec]:
    """Spec of a known Qwen release by hub id (`Qwen/Qwen2.5-7B-Instruct`, any case), or None."""
    short = hub_id.rsplit("/", 1)[-1].lower()
    m = _SUFFIX.match(short)
    if not m or m.group("base") not in KNOWN:
        return None
    quant = _QUANT[m.group("quant")] if m.group("quant") else None
    return _from_shape(hub_id, KNOWN[m.group("base")], quant)


def resolve_model(name: str, base_dir: Optional[str] = None) -> ModelSpec:
    """The spec of `name`: builtin:tiny, a local directory with config.json, or a known hub id.

    Raises UnknownModel otherwise. Reads at most one small file; imports nothing heavy.
    """
    if name == "builtin:tiny":
        return _from_shape(name, TINY)
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
