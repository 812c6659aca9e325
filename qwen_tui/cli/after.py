"""`qwen-tui merge RUN_DIR` and `qwen-tui chat RUN_DIR --prompt TEXT`: use a finished run's model.

Both run on the run's master node with the run's own Python (training.merge,
training.chat); this process imports no torch. See qwen_tui.run.tools.after.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..run.tools.after import CHAT_TIMEOUT_S, MERGE_TIMEOUT_S, AfterRunError, chat, chat_turn, locate, merge

# as `attach` takes it (run.runs.resolve_run)
RUN_HELP = "a run id (or a unique prefix of one) from `qwen-tui runs`, 'last' for the newest run, or a run directory"
RUNS_DIR_HELP = "where run directories live (default $QWEN_TUI_RUNS, else $XDG_STATE_HOME/qwen-tui/runs)"


def add_parser(subparsers: Any) -> None:
    m = subparsers.add_parser("merge", help="merge a finished run's LoRA adapter into its base: OUTPUT_DIR/merged, "
                              "checked by reloading",
                              description="Merge a finished LoRA run's adapter into its base model, on the run's "
                              "master node with the run's own Python, into OUTPUT_DIR/merged. The merged model is "
                              "kept only if, reloaded, its loss on the eval data (else the data) equals the "
                              "adapter's on its base.")
    m.add_argument("run_dir", metavar="RUN", help=RUN_HELP)
    m.add_argument("--dtype", choices=("auto", "bf16", "fp16", "fp32"), default="auto",
                   help="dtype of the merged weights (default: the base model's own)")
    m.add_argument("--force", action="store_true", help="replace an existing OUTPUT_DIR/merged")
    m.add_argument("--timeout", type=float, default=MERGE_TIMEOUT_S, help=f"seconds (default {MERGE_TIMEOUT_S:g})")
    m.add_argument("--json", action="store_true", help="print the merge report as JSON")
    m.add_argument("--accept-new-host-keys", action="store_true", help="trust a remote master's new host key")
    m.add_argument("--runs-dir", default=None, help=RUNS_DIR_HELP)
    m.set_defaults(func=run_merge)

    c = subparsers.add_parser("chat", help="talk to a finished run's model (merged, or the adapter on its base)",
                              description="Talk to a finished run's model through its chat template, on the run's "
                              "master node: OUTPUT_DIR/merged where it exists, else the adapter on its base. With "
                              "--prompt, one reply; without, a conversation on the terminal, one message a line.")
    c.add_argument("run_dir", metavar="RUN", help=RUN_HELP)
    c.add_argument("--prompt", default=None, help="one user message: print the reply and exit (without it: a chat "
                   "on the terminal, one message a line; an empty line or end of input ends it)")
    c.add_argument("--system", default=None, help="a system message before the prompt")
    c.add_argument("--max-new-tokens", type=int, default=256, help="longest reply in tokens (default 256)")
    c.add_argument("--temperature", type=float, default=0.0, help="0 (the default) decodes greedily")
    c.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: a GPU if there is one")
    c.add_argument("--timeout", type=float, default=CHAT_TIMEOUT_S, help=f"seconds (default {CHAT_TIMEOUT_S:g})")
    c.add_argument("--json", action="store_true", help="print the reply as JSON (reply, tokens, model)")
    c.add_argument("--accept-new-host-keys", action="store_true", help="trust a remote master's new host key")
    c.add_argument("--runs-dir", default=None, help=RUNS_DIR_HELP)
    c.set_defaults(func=run_chat)


def _with_master(args: argparse.Namespace, work) -> int:
    from ..nodes.connect import transport_for
    from ..nodes.transport.protocol import TransportError
    from ..run.rundir import default_runs_root
    from ..run.runs import RunNotFound, resolve_run

    root = Path(args.runs_dir).absolute() if args.runs_dir else default_runs_root()
    try:
        res = locate(resolve_run(args.run_dir, root))
    except RunNotFound as e:
        print(f"qwen-tui: {e}", file=sys.stderr)
        return 2
    except AfterRunError as e:
        print(f"qwen-tui: {e}", file=sys.stderr)
        return 1
    try:
        transport = transport_for(res.master, res.preset, accept_new_host_keys=args.accept_new_host_keys)
    except TransportError as e:
        print(f"qwen-tui: node 0 ({res.master.label}): {e}", file=sys.stderr)
        return 1
    try:
        return work(res, transport)
    except AfterRunError as e:
        print(f"qwen-tui: {e}", file=sys.stderr)
        return 1
    finally:
        transport.close()


def run_merge(args: argparse.Namespace) -> int:
    def work(res, transport) -> int:
        rep = merge(res, transport, force=args.force, dtype=args.dtype, timeout=args.timeout)
        if args.json:
            print(json.dumps(rep, indent=2))
        elif rep["merged_dir"] is None:
            print(rep["message"])
        else:
            ck = rep["check"]
            print(f"merged {rep['model_dir']} into {rep['base']} -> {rep['merged_dir']} ({rep['dtype']}, "
                  f"{rep['seconds']:.1f} s)")
            print(f"checked by reloading: loss {ck['merged_loss']:.5f} merged, {ck['adapter_loss']:.5f} adapter on "
                  f"its base ({ck['records']} records of {ck['data']}, relative difference {ck['relative_diff']:.1e})")
        return 0

    return _with_master(args, work)


def _conversation(args: argparse.Namespace, res, transport) -> int:
    """A chat on the terminal: the whole conversation goes to the model each turn."""
    msgs = [{"role": "system", "content": args.system}] if args.system else []
    print(f"chatting with {res.output_dir} on node 0 ({transport.label}); an empty line ends", file=sys.stderr)
    while True:
        try:
            text = input("you> ")
        except EOFError:
            return 0
        if not text.strip():
            return 0
        msgs.append({"role": "user", "content": text})
        rep = chat_turn(res, transport, msgs, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        device=args.device, timeout=args.timeout)
        msgs.append({"role": "assistant", "content": rep["reply"]})
        print(f"model> {rep['reply']}", flush=True)


def run_chat(args: argparse.Namespace) -> int:
    def work(res, transport) -> int:
        if args.prompt is None:
            return _conversation(args, res, transport)
        rep = chat(res, transport, args.prompt, system=args.system, max_new_tokens=args.max_new_tokens,
                   temperature=args.temperature, device=args.device, timeout=args.timeout)
        print(json.dumps(rep) if args.json else rep["reply"])
        return 0

    return _with_master(args, work)
