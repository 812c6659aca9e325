"""What a finished run left in its output directory, and loading it for inference (merge and chat).

OUTPUT_DIR holds either a LoRA adapter (adapter_config.json + weights, the
tokenizer) or a full model (config.json + weights, the tokenizer), and with
--merge_lora (or `python -m training.merge`) a full model in OUTPUT_DIR/merged.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from training.runtime.errors import InputError

log = logging.getLogger("training")


@dataclass
class RunOutput:
    model_dir: Path
    kind: str  # "adapter" or "full"
    base: str | None  # the adapter's base model (resolved: a local directory or a hub id), None for a full model
    merged: Path | None  # OUTPUT_DIR/merged when it holds a model

    @property
    def tokenizer_dir(self) -> Path:
        return self.model_dir


def inspect(model_dir: str, base: str | None = None) -> RunOutput:
    """Reads OUTPUT_DIR; `base` (a model name, path or builtin:tiny) overrides the adapter's recorded base."""
    from training.model.pretrained import resolve_model_source

    d = Path(model_dir).expanduser()
    if not d.is_dir():
        raise InputError(f"{model_dir}: output directory not found (has the run finished and saved?)")
    merged = d / "merged"
    merged = merged if (merged / "config.json").is_file() else None
    if (d / "adapter_config.json").is_file():
        try:
            recorded = json.loads((d / "adapter_config.json").read_text(encoding="utf-8")).get("base_model_name_or_path")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"{d / 'adapter_config.json'}: not valid JSON: {e}") from None
        source = base or recorded
        if not source:
            raise InputError(f"{d / 'adapter_config.json'}: no base_model_name_or_path; give the base model")
        return RunOutput(d, "adapter", resolve_model_source(source, 0), merged)
    if (d / "config.json").is_file():
        return RunOutput(d, "full", None, merged)
    raise InputError(f"{model_dir}: holds neither a LoRA adapter (adapter_config.json) nor a model (config.json); "
                     "the run may not have finished")


def pick_device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA GPU here")
    return torch.device(name)


def pick_dtype(name: str, device):
    import torch

    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def check_base_unquantized(source: str) -> None:
    from training.model.pretrained import quantization_method, read_config_dict

    quant = quantization_method(read_config_dict(source))
    if quant in ("gptq", "awq"):
        raise InputError(f"{source}: the base is {quant}-quantized; merge the adapter into the unquantized release "
                         "(give it with --base)")


def load_for_inference(out: RunOutput, device, dtype, prefer_merged: bool = True):
    """The model to generate or evaluate with: OUTPUT_DIR/merged if there (and preferred), else the full model,
    else the base with the adapter on it (not merged)."""
    from transformers import AutoModelForCausalLM

    if prefer_merged and out.merged is not None:
        path = out.merged
    elif out.kind == "full":
        path = out.model_dir
    else:
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(out.base, dtype=dtype)
        return PeftModel.from_pretrained(base, str(out.model_dir)).to(device).eval()
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()


def eval_loss(model, tokenizer, data_path: str, max_length: int, max_records: int, device, batch_size: int = 8) -> dict:
    """Token-mean loss on (the first `max_records` records of) a chat file, through the worker's encoder."""
    import torch

    from training.data.batches import Collator, build_dataset
    from training.data.encoding import IGNORE_INDEX, ChatEncoder
    from training.data.records import load_conversations

    convs = load_conversations(data_path)[:max_records]
    ds = build_dataset(convs, ChatEncoder(tokenizer, max_length), lazy=False)
    col = Collator(tokenizer.pad_token_id)
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(ds), batch_size):
            b = col([ds[j] for j in range(i, min(i + batch_size, len(ds)))])
            logits = model(input_ids=b["input_ids"].to(device), attention_mask=b["attention_mask"].to(device)).logits
            labels = b["labels"].to(device)[:, 1:]
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels.flatten(),
                                                     ignore_index=IGNORE_INDEX, reduction="sum")
            total += loss.item()
            n += int((labels != IGNORE_INDEX).sum())
    return {"loss": total / max(n, 1), "records": len(ds), "tokens": n}
