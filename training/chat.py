"""Talk to a finished run's model: `python -m training.chat OUTPUT_DIR --prompt TEXT`.

Loads OUTPUT_DIR/merged if it is there, else the full model, else the base with
the adapter on it; renders the conversation with the tokenizer's own chat
template (add_generation_prompt) and generates one reply. With --prompt it
prints {"reply": ...} as one JSON line. With --stdin it reads one JSON object a
line ({"messages": [...]}) and answers each with one JSON line, keeping the
model loaded (the interactive chat's back end). Exit codes: 0 done; 2 bad input;
1 anything else.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys

from training.runtime.errors import EXIT_BAD_INPUT, EXIT_OK, InputError, report_failure


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.chat", description=__doc__.split("\n\n")[0])
    p.add_argument("output_dir", help="the run's output directory")
    p.add_argument("--base", default=None, help="the adapter's base model (default: as the adapter records it)")
    p.add_argument("--prompt", default=None, help="one user message: print the reply and exit")
    p.add_argument("--stdin", action="store_true", help="answer JSON lines {\"messages\": [...]} from stdin")
    p.add_argument("--system", default=None, help="a system message before the prompt")
    p.add_argument("--max_new_tokens", type=int, default=256, help="longest reply in tokens (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (the default) decodes greedily")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: cuda if there is one")
    p.add_argument("--dtype", choices=("auto", "bf16", "fp16", "fp32"), default="auto",
                   help="default: bf16 (or fp16) on CUDA, fp32 on CPU")
    p.add_argument("--no_merged", action="store_true", help="use the adapter even when OUTPUT_DIR/merged exists")
    return p


class Chat:
    def __init__(self, args):
        from training.model.pretrained import load_tokenizer
        from training.model.result import inspect, load_for_inference, pick_device, pick_dtype

        self.args = args
        self.out = inspect(args.output_dir, args.base)
        self.device = pick_device(args.device)
        self.model = load_for_inference(self.out, self.device, pick_dtype(args.dtype, self.device),
                                        prefer_merged=not args.no_merged)
        self.tok = load_tokenizer(str(self.out.tokenizer_dir))
        if not getattr(self.tok, "chat_template", None):
            from training.data.encoding import CHATML_TEMPLATE

            self.tok.chat_template = CHATML_TEMPLATE
        self.source = str(self.out.merged if self.out.merged and not args.no_merged else self.out.model_dir)

    def reply(self, messages: list[dict]) -> dict:
        import torch

        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        enc = self.tok(text, return_tensors="pt", add_special_tokens=False).to(self.device)
        end = [i for i in {self.tok.convert_tokens_to_ids("<|im_end|>"), self.tok.eos_token_id}
               if isinstance(i, int) and i >= 0]
        a = self.args
        kw = dict(max_new_tokens=a.max_new_tokens, eos_token_id=end or None, pad_token_id=self.tok.pad_token_id)
        kw.update(do_sample=True, temperature=a.temperature) if a.temperature > 0 else kw.update(do_sample=False)
        with torch.no_grad():
            out = self.model.generate(**enc, **kw)
        new = out[0, enc["input_ids"].shape[1]:]
        return {"reply": self.tok.decode(new, skip_special_tokens=True).strip(), "tokens": int(new.shape[0]),
                "model": self.source}


def _messages(args) -> list[dict]:
    if not args.prompt.strip():
        raise InputError("--prompt is empty")
    msgs = [{"role": "system", "content": args.system}] if args.system else []
    return msgs + [{"role": "user", "content": args.prompt}]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (args.prompt is None) == (not args.stdin):
        print("error: give --prompt TEXT or --stdin", file=sys.stderr)
        return EXIT_BAD_INPUT
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
    real_out = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries the JSON alone
            chat = Chat(args)
            if args.prompt is not None:
                print(json.dumps(chat.reply(_messages(args))), file=real_out, flush=True)
                return EXIT_OK
            print(json.dumps({"ready": True, "model": chat.source}), file=real_out, flush=True)
            for line in sys.stdin:
                if not line.strip():
                    continue
                try:
                    msgs = json.loads(line)["messages"]
                except (ValueError, KeyError, TypeError):
                    print(json.dumps({"error": "expected {\"messages\": [...]}"}), file=real_out, flush=True)
                    continue
                print(json.dumps(chat.reply(msgs)), file=real_out, flush=True)
    except Exception as e:
        return report_failure(e)
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
