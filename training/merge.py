"""Merge a finished run's LoRA adapter into its base model: `python -m training.merge OUTPUT_DIR`.

Writes OUTPUT_DIR/merged (a full model and the tokenizer) through a temporary
directory renamed into place, then checks it by reloading: the merged model's
loss on a few records (--check_data) must equal the adapter's on its base.
Prints one JSON object on stdout. A full fine-tuning run has nothing to merge:
it says so and exits 0. Exit codes: 0 done; 2 bad input (one line on stderr);
1 anything else, the check included (nothing is left behind then).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import time

from training.runtime.errors import EXIT_OK, InputError, report_failure

# Relative difference of the two losses the check allows: the merged weights are the adapter's sum rounded once.
TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 1e-2}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.merge", description=__doc__.split("\n\n")[0])
    p.add_argument("output_dir", help="the run's output directory (an adapter, or a full model)")
    p.add_argument("--base", default=None, help="the base model (default: the adapter's base_model_name_or_path)")
    p.add_argument("--out", default=None, help="where the merged model goes (default OUTPUT_DIR/merged)")
    p.add_argument("--dtype", choices=("auto", "bf16", "fp16", "fp32"), default="auto",
                   help="dtype of the merged weights (default: the base's own, as its config.json says)")
    p.add_argument("--force", action="store_true", help="replace an existing merged model")
    p.add_argument("--check_data", default=None, help="chat data for the reload check (default: none, logits of a probe)")
    p.add_argument("--check_records", type=int, default=32, help="records of --check_data the check uses (default 32)")
    p.add_argument("--model_max_length", type=int, default=2048, help="token limit of a check record (default 2048)")
    return p


def _dtype_name(args, base: str) -> str:
    if args.dtype != "auto":
        return args.dtype
    from training.model.pretrained import read_config_dict

    cfg = read_config_dict(base)
    name = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")
    return {"bfloat16": "bf16", "float16": "fp16"}.get(name, "fp32")


def merge(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from training.model.pretrained import load_tokenizer, merge_adapter
    from training.model.result import check_base_unquantized, eval_loss, inspect, load_for_inference

    out = inspect(args.output_dir, args.base)
    if out.kind == "full":
        return {"kind": "full", "model_dir": str(out.model_dir), "merged_dir": None,
                "message": f"{out.model_dir} holds a full fine-tuned model: nothing to merge"}
    check_base_unquantized(out.base)
    dest = os.path.abspath(args.out or os.path.join(out.model_dir, "merged"))
    if os.path.exists(dest) and not args.force:
        raise InputError(f"{dest} already exists; --force replaces it")
    dname = _dtype_name(args, out.base)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dname]
    tokenizer = load_tokenizer(str(out.tokenizer_dir))
    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.monotonic()
    try:
        merge_adapter(out.base, str(out.model_dir), tmp, dtype, tokenizer)
        # The check: the merged model, reloaded from disk, against the adapter on its base (both on CPU, same dtype).
        cpu = torch.device("cpu")
        merged = AutoModelForCausalLM.from_pretrained(tmp, dtype=dtype).eval()
        adapter = load_for_inference(out, cpu, dtype, prefer_merged=False)
        if args.check_data:
            a = eval_loss(adapter, tokenizer, args.check_data, args.model_max_length, args.check_records, cpu)
            m = eval_loss(merged, tokenizer, args.check_data, args.model_max_length, args.check_records, cpu)
            check = {"data": args.check_data, "records": a["records"], "tokens": a["tokens"],
                     "adapter_loss": a["loss"], "merged_loss": m["loss"]}
            diff = abs(a["loss"] - m["loss"]) / max(abs(a["loss"]), 1e-8)
        else:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": "Hello! Who are you?"}],
                                                tokenize=False, add_generation_prompt=True)
            x = tokenizer(ids, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                la, lm = adapter(input_ids=x).logits.float(), merged(input_ids=x).logits.float()
            diff = ((la - lm).abs().max() / la.abs().max().clamp(min=1e-8)).item()
            check = {"probe_tokens": int(x.shape[1]), "max_logit_diff": (la - lm).abs().max().item()}
        check["relative_diff"] = diff
        if diff > TOLERANCE[dname]:
            raise RuntimeError(f"the reloaded merged model differs from the adapter on its base by {diff:.2e} "
                               f"(relative; allowed {TOLERANCE[dname]:.0e}): not kept")
        if os.path.exists(dest):
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"kind": "adapter", "model_dir": str(out.model_dir), "base": out.base, "merged_dir": dest, "dtype": dname,
            "check": check, "seconds": round(time.monotonic() - t0, 2)}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries the JSON alone
            report = merge(args)
    except Exception as e:
        return report_failure(e)
    print(json.dumps(report))
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
