"""Loading the model and tokenizer, and turning them into what the method trains.

full:  every weight trains.
lora:  peft LoRA adapters on the decoder projections; the base is frozen.
qlora: LoRA on a 4-bit base: nf4 via bitsandbytes for a normal checkpoint, or
       the checkpoint's own GPTQ/AWQ quantization (Qwen's -Int4 releases),
       after peft's k-bit preparation.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path

from training.flags import LoraFlags, TrainFlags
from training.runtime.errors import InputError

log = logging.getLogger("training")
PREQUANTIZED = {"gptq": ("optimum", "gptqmodel"), "awq": ("awq",)}
# The dtype a full model is exported in (set by load_model, read by save_pretrained_here).
SAVE_DTYPE_ATTR = "_finetune_save_dtype"
HALF_NAMES = {"bfloat16", "float16"}


def resolve_model_source(name_or_path: str, local_rank: int) -> str:
    """`builtin:tiny` (or tiny-moe, tiny-qwen2-moe) -> the cached tiny model; a local directory must hold a
    config.json."""
    from training.model.tiny import BUILTINS

    if name_or_path in BUILTINS:
        from training.model.tiny import ensure_builtin_tiny

        return str(ensure_builtin_tiny(local_rank, name_or_path))
    if name_or_path.startswith("builtin:"):
        raise InputError(f"unknown built-in model {name_or_path!r}; known: {', '.join(BUILTINS)}")
    p = Path(name_or_path).expanduser()
    looks_local = p.exists() or name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
    if looks_local:
        if not p.is_dir():
            raise InputError(f"{name_or_path}: model directory not found")
        if not (p / "config.json").is_file():
            raise InputError(f"{name_or_path}: no config.json in the model directory")
        return str(p)
    # A hub id such as Qwen/Qwen2.5-7B-Instruct: the copy `qwen-tui check --sync` put in the workdir (the master
    # downloaded it once), else the hub itself (or its cache).
    synced = Path(".qwen-tui", "models", name_or_path.replace("/", "--"))
    if (synced / "config.json").is_file():
        log.info("%s: using the synced copy in %s", name_or_path, synced.resolve())
        return str(synced.resolve())
    return name_or_path


def read_config_dict(source: str) -> dict:
    """The model's config.json as a dict, without importing transformers where it is local."""
    p = Path(source) / "config.json"
    if p.is_file():
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"{p}: config.json is not valid JSON: {e}") from None
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source).to_dict()
    except (OSError, ValueError) as e:
        raise InputError(f"{source}: cannot load the model config: {str(e).splitlines()[0]}") from None


def quantization_method(config: dict) -> str | None:
    q = config.get("quantization_config")
    if not q:
        return None
    return str(q.get("quant_method", "unknown")).lower()


def check_method(lora: LoraFlags, model_name: str, fp16: bool, config: dict, on_cuda: bool, stage: int) -> str:
    """Returns 'full', 'lora' or 'qlora' for `lora`'s flags, or raises InputError for a setup that cannot work."""
    quant = quantization_method(config)
    if fp16 and not on_cuda:
        raise InputError("--fp16 needs a CUDA GPU; use --bf16 or full precision on CPU")
    if quant and not lora.q_lora:
        raise InputError(f"{model_name}: the checkpoint is {quant}-quantized; "
                         "only --q_lora can train it (LoRA on the frozen quantized base)")
    if not lora.q_lora:
        return "lora" if lora.use_lora else "full"
    if stage == 3 and quant:
        raise InputError(f"--q_lora on a {quant.upper()}-quantized checkpoint does not work with ZeRO-3 (its packed "
                         "weights cannot be partitioned); use ZeRO-2, or a plain checkpoint (quantized to nf4 on load, "
                         "which ZeRO-3 shards)")
    if lora.merge_lora and quant:
        raise InputError(f"--merge_lora cannot merge into a {quant}-quantized base; merge into the unquantized model")
    if quant:
        if quant not in PREQUANTIZED:
            raise InputError(f"{model_name}: --q_lora supports GPTQ, AWQ or a plain checkpoint, "
                             f"not {quant!r}")
        missing = [m for m in PREQUANTIZED[quant] if importlib.util.find_spec(m) is None]
        if missing:
            raise InputError(f"--q_lora on a {quant.upper()} checkpoint needs the Python packages: {', '.join(missing)}")
        if not on_cuda:
            raise InputError(f"--q_lora on a {quant.upper()} checkpoint needs a CUDA GPU (its kernels have no CPU path here)")
        return "qlora"
    if importlib.util.find_spec("bitsandbytes") is None:
        raise InputError("--q_lora needs the bitsandbytes package for 4-bit nf4 quantization")
    from training.model.moe import layout_of_config, moe_shape

    if moe_shape(config) and layout_of_config(config) == "fused":
        raise InputError(f"--q_lora: {model_name} is a mixture-of-experts model, and this "
                         "transformers stores its experts fused as 3-D tensors, which bitsandbytes cannot quantize (it "
                         "quantizes nn.Linear layers only): nearly all of the weights would stay in 16 bits. Use "
                         "--use_lora (a 16-bit base, sharded by ZeRO-3 across GPUs) instead")
    return "qlora"


def load_tokenizer(source: str):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as e:
        raise InputError(f"{source}: cannot load the tokenizer: {str(e).splitlines()[0]}") from None
    if tok.pad_token_id is None:
        # Qwen ships <|endoftext|> as pad; padded positions carry no labels either way.
        tok.pad_token = "<|endoftext|>" if "<|endoftext|>" in tok.get_vocab() else tok.eos_token
    return tok


def load_model(source: str, method: str, device, load_dtype, quant: str | None, zero_stage: int = 0, *,
               train: TrainFlags, random_init: bool = False):
    """Loads the causal LM in load_dtype; for Q-LoRA quantizes to nf4 on load (unless already quantized).
    Q-LoRA under ZeRO-3 (zero_stage 3): the 4-bit weights are stored in the compute dtype, so DeepSpeed can
    partition them like any other weight (PEFT's recipe for DeepSpeed ZeRO-3 + QLoRA), and they are quantized in
    host memory: a base that only fits the GPUs once sharded never has to fit one GPU whole. deepspeed.initialize
    then moves each rank's shard to its GPU (shard_quantized_base moves the quantization constants)."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": load_dtype}
    save_dtype = export_dtype(train, source)
    if random_init:
        from transformers import AutoConfig

        if method == "qlora":
            raise InputError("--random_init cannot build a quantized model; use --use_lora or full fine-tuning")
        config = AutoConfig.from_pretrained(source)
        torch.manual_seed(train.seed)
        with torch.device(device):  # built where it trains: no copy of random weights through the host
            model = AutoModelForCausalLM.from_config(config, dtype=load_dtype)
        model.config.use_cache = False
        model.config.output_router_logits = False
        setattr(model, SAVE_DTYPE_ATTR, save_dtype)
        return model
    if method == "qlora":
        compute = torch.bfloat16 if train.bf16 else torch.float16 if train.fp16 else torch.float32
        sharded = zero_stage == 3
        if quant is None:
            from transformers import BitsAndBytesConfig

            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=compute, **({"bnb_4bit_quant_storage": compute} if sharded else {}),
            )
        kwargs["dtype"] = compute
        # quantize straight onto this process's device; under ZeRO-3 in host memory, sharded later
        kwargs["device_map"] = {"": "cpu" if sharded else device}
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    model.config.use_cache = False  # the KV cache is for generation; training only wastes memory on it
    # The worker adds the routers' load-balancing loss itself (training.model.moe), on every path, once.
    model.config.output_router_logits = False
    setattr(model, SAVE_DTYPE_ATTR, save_dtype)
    return model


def export_dtype(train: TrainFlags, source: str):
    """What a full fine-tune's model is saved in: the half precision it trained in (--bf16/--fp16), else the
    dtype its checkpoint declares (Qwen releases are bf16), else float32. Plain full fine-tuning keeps fp32
    weights while it trains (autocast computes in half precision), which users of transformers and vLLM do not
    expect to find in the saved model: twice the size, and loaded as fp32 by dtype="auto"."""
    import torch

    if train.bf16:
        return torch.bfloat16
    if train.fp16:
        return torch.float16
    try:
        config = read_config_dict(source)
    except InputError:
        return torch.float32
    declared = str(config.get("dtype") or config.get("torch_dtype") or "float32").removeprefix("torch.")
    return getattr(torch, declared) if declared in HALF_NAMES else torch.float32


def checkpointing(model, on: bool) -> None:
    """Activation (gradient) checkpointing on or off, non-reentrant: it needs no input grads, so it works with a
    frozen base too. transformers 5.x names it activation_checkpointing_* (the gradient_checkpointing_* names
    warn and go in v6); older releases have only those."""
    if on:
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()


def checkpointing_is_on(model) -> bool:
    return bool(getattr(model, "is_activation_checkpointing", None)
                if hasattr(model, "activation_checkpointing_enable") else model.is_gradient_checkpointing)


def apply_method(model, method: str, lora: LoraFlags, *, train_router: bool, checkpointed: bool):
    """Enables gradient checkpointing (`checkpointed`: as set-up resolved it) and wraps the model with LoRA
    adapters where asked (`lora`); `train_router`: a mixture of experts' routers train (--train_router)."""
    if method == "qlora":
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=checkpointed,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    elif checkpointed:
        checkpointing(model, True)
    from training.model import moe

    routers = moe.sparse_blocks(model)
    if method == "full":
        if routers:
            moe.set_router_trainable(model, train_router)
            log.info("mixture of experts: %d routers %s", len(routers),
                     "train (--train_router)" if train_router else "frozen (--train_router "
                     "trains them)")
        return model
    from peft import LoraConfig, get_peft_model

    modules, params, unknown = moe.lora_targets(model, lora.lora_target_modules)
    if unknown:
        raise InputError(f"--lora_target_modules: the model has no modules named {', '.join(unknown)}")
    extra = {}
    if params:
        extra["target_parameters"] = params  # fused experts: peft's LoRA on 3-D parameters
    if routers and train_router:
        extra["modules_to_save"] = [moe.ROUTER_KEY]  # trained in full and saved with the adapter
    # peft's LoRA on fused 3-D expert weights (target_parameters) has no dropout and refuses any: the adapters are
    # made without it, and the dropout asked for goes on the adapters of nn.Linear modules alone
    dropout = lora.lora_dropout
    cfg = LoraConfig(
        r=lora.lora_r, lora_alpha=lora.lora_alpha, lora_dropout=0.0 if params else dropout,
        target_modules=modules, bias="none", task_type="CAUSAL_LM", **extra,
    )
    model = get_peft_model(model, cfg)
    if params and dropout > 0:
        n = _linear_lora_dropout(model, dropout)
        log.info("LoRA dropout %g on the %d adapted linear modules; none on the fused experts' adapters (%s): "
                 "peft's LoRA on 3-D parameters has no dropout", dropout, n, ", ".join(params))
    if routers:
        log.info("mixture of experts (%s experts): LoRA on %s; routers %s", moe.expert_layout(model),
                 ", ".join(modules + params), "trained (--train_router)" if extra.get("modules_to_save")
                 else "frozen")
    # ZeRO-3 partitions the base while it loads: a partitioned weight holds 0 elements here, ds_numel of them.
    trainable = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad)
    total = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    log.info("LoRA r=%d alpha=%d on %s: %d trainable of %d parameters",
             lora.lora_r, lora.lora_alpha, ",".join(lora.lora_target_modules), trainable, total)
    return model


def _linear_lora_dropout(model, p: float) -> int:
    """Dropout `p` on every LoRA adapter of an nn.Linear (peft's lora.Linear); how many got it."""
    import torch.nn as nn
    from peft.tuners.lora.layer import Linear as LoraLinear

    n = 0
    for m in model.modules():
        if isinstance(m, LoraLinear):
            for name in list(m.lora_dropout.keys()):
                m.lora_dropout[name] = nn.Dropout(p=p)
            n += 1
    return n


def shard_quantized_base(model, device) -> int:
    """After deepspeed.initialize has partitioned a 4-bit base onto the GPUs (ZeRO-3): the quantization constants
    (absmax and the like, a few per 64 weights, kept beside each weight rather than in it) follow to this rank's
    device. Returns how many 4-bit weights."""
    n = 0
    for m in model.modules():
        w = getattr(m, "weight", None)
        state = getattr(w, "quant_state", None)
        if state is not None and hasattr(state, "to"):
            state.to(device)
            n += 1
    return n


def merge_adapter(source: str, adapter_dir: str, out_dir: str, dtype, tokenizer) -> None:
    """Loads the unquantized base afresh on CPU, merges the saved adapter and saves the full model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    save_pretrained_here(merged, out_dir, for_resume=False)
    tokenizer.save_pretrained(out_dir)


def save_pretrained_here(model, out_dir, *, for_resume: bool, **kwargs) -> None:
    """model.save_pretrained on this process, whatever its global rank. Under torch.distributed, transformers
    (5.x) writes a model only on global rank 0 and silently skips the rest, so with --save_on_each_node the
    other nodes got a tokenizer and no weights; the worker decides who saves (the recipe's is_saver).

    A full model is saved as users load it: in its export dtype (export_dtype) and with use_cache true (it is
    off only while training). A checkpoint to resume from (`for_resume`) keeps the weights exactly as they train."""
    # a PEFT model forwards attribute lookups to its base: its adapters keep their own dtype
    target = None if hasattr(model, "peft_config") else getattr(model, SAVE_DTYPE_ATTR, None)
    if target is not None and not for_resume:
        kwargs["state_dict"] = _cast_state_dict(kwargs.get("state_dict") or model.state_dict(), target)
    _save_on_this_rank(model, out_dir, **kwargs)
    if target is not None:
        _fix_saved_config(Path(out_dir), None if for_resume else target)


def _cast_state_dict(state: dict, dtype) -> dict:
    """Floating tensors cast to dtype on the CPU (one at a time: no second copy of the model on the GPU); a tied
    weight stays one tensor under both names."""
    done, out = {}, {}
    for name, t in state.items():
        if id(t) not in done:
            done[id(t)] = t.detach().to("cpu", dtype=dtype) if t.is_floating_point() else t
        out[name] = done[id(t)]
    return out


def _fix_saved_config(out: Path, dtype) -> None:
    """config.json as users load the model: use_cache true, and the dtype the weights were written in
    (transformers writes the dtype of the parameters in memory)."""
    path = out / "config.json"
    if not path.is_file():
        return  # another node's saver wrote it (or a PEFT adapter, which has no config.json)
    config = json.loads(path.read_text(encoding="utf-8"))
    config["use_cache"] = True
    if dtype is not None:
        config["dtype"] = str(dtype).removeprefix("torch.")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _save_on_this_rank(model, out_dir, **kwargs) -> None:
    if hasattr(model, "should_save_on_this_rank"):
        model.should_save_on_this_rank = lambda is_main_process: is_main_process  # this instance only
        try:
            model.save_pretrained(out_dir, **kwargs)
        finally:
            del model.should_save_on_this_rank
    else:
        model.save_pretrained(out_dir, **kwargs)
