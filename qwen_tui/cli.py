"""qwen-tui's command line. No arguments (or a preset path) opens the wizard; the
subcommands do the same work headless."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

from . import __version__
from .preset import Preset, PresetError, load_preset

REPO_PRESETS = Path(__file__).resolve().parent.parent / "presets"
DEMO_PRESET = REPO_PRESETS / "local-demo.yaml"


def _err(msg: str) -> None:
    print(f"qwen-tui: {msg}", file=sys.stderr)


def _load(path: str) -> Preset:
    return load_preset(path)


# ------------------------------------------------------------------ commands

def cmd_replay(args: argparse.Namespace) -> int:
    from .run.session import prepare_and_launch

    return prepare_and_launch(args.preset, dry_run=args.dry_run, runs_root=args.runs_dir,
                              accept_new_host_keys=args.accept_new_host_keys, force=args.force,
                              skip_checks=args.skip_checks, max_seconds=args.max_seconds)


def cmd_demo(args: argparse.Namespace) -> int:
    from .run.session import prepare_and_launch

    if not DEMO_PRESET.exists():
        _err(f"the demo preset {DEMO_PRESET} is missing: run from a source checkout (pip install -e .)")
        return 2
    return prepare_and_launch(str(DEMO_PRESET), dry_run=args.dry_run, runs_root=args.runs_dir,
                              accept_new_host_keys=False, force=False, skip_checks=False,
                              max_seconds=args.max_seconds)


def cmd_attach(args: argparse.Namespace) -> int:
    from .run.session import attach

    return attach(args.run_dir, accept_new_host_keys=args.accept_new_host_keys, stop=args.stop)


def cmd_export(args: argparse.Namespace) -> int:
    from .plan import make_plan
    from .run.export import render
    from .run.rundir import new_run_id

    preset = _load(args.preset)
    run_id = new_run_id(preset.name or Path(args.preset).stem)
    plan = make_plan(preset, run_id=run_id, local_run_dir=f"runs/{run_id}", base_dir=os.getcwd())
    files = render(plan, args.format)
    out = Path(args.output) if args.output else None
    if out is None:
        if len(files) == 1:
            sys.stdout.write(next(iter(files.values())))
            return 0
        out = Path(f"{Path(args.preset).stem}-{args.format}")
    # Path() drops a trailing slash: "-o dir/" asks for a directory, so look at the argument
    if len(files) > 1 or out.is_dir() or (args.output or "").endswith(os.sep):
        if out.exists() and not out.is_dir():
            _err(f"{out}: exists and is not a directory (the {args.format} format writes "
                 f"{len(files)} files into a directory)")
            return 2
        out.mkdir(parents=True, exist_ok=True)
        targets = {out / name: text for name, text in files.items()}
    else:
        targets = {out: next(iter(files.values()))}
    from .atomic import write_text_atomic

    for path, text in targets.items():
        write_text_atomic(path, text, mode=0o755)
        print(f"wrote {path}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """Print the validated preset (defaults filled) as YAML."""
    from .preset import dump_preset

    sys.stdout.write(dump_preset(_load(args.preset)))
    return 0


def cmd_tui(preset: Optional[str]) -> int:
    try:
        from .ui.app import run_app
    except ImportError as e:
        _err(f"the wizard cannot start: {e}")
        return 1
    return run_app(preset)


# ------------------------------------------------------------------ parser

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="qwen-tui",
        description="Set up, check, launch and watch multi-node fine-tuning of Qwen models. "
                    "With no command (or with a preset path) it opens the wizard.",
    )
    p.add_argument("--version", action="version", version=f"qwen-tui {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def launch_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--dry-run", action="store_true", help="print each node's command and environment; launch nothing")
        sp.add_argument("--runs-dir", default=None, help="where run directories go (default ./runs or $QWEN_TUI_RUNS)")
        sp.add_argument("--max-seconds", type=float, default=None, help="stop the run if it has not finished by then")

    r = sub.add_parser("replay", help="run a preset headless: checks, plan, launch, live view")
    r.add_argument("preset", help="a preset YAML file")
    launch_opts(r)
    r.add_argument("--accept-new-host-keys", action="store_true", help="trust and record host keys seen for the first time")
    r.add_argument("--force", action="store_true", help="launch although the checks found errors")
    r.add_argument("--skip-checks", action="store_true", help="launch without running the checks first")
    r.set_defaults(func=cmd_replay)

    d = sub.add_parser("demo", help="train the tiny model on two local 'nodes' (the local-demo preset)")
    launch_opts(d)
    d.set_defaults(func=cmd_demo)

    a = sub.add_parser("attach", help="watch (or stop) a run started earlier, from its run directory")
    a.add_argument("run_dir")
    a.add_argument("--stop", action="store_true", help="stop every node of that run")
    a.add_argument("--accept-new-host-keys", action="store_true")
    a.set_defaults(func=cmd_attach)

    e = sub.add_parser("export", help="write SLURM, PBS or per-node shell scripts that run the same plan")
    e.add_argument("preset")
    e.add_argument("--format", choices=("slurm", "pbs", "sh"), default="sh")
    e.add_argument("-o", "--output", help="file (slurm, pbs) or directory (sh); default stdout for one file")
    e.set_defaults(func=cmd_export)

    s = sub.add_parser("show", help="print a preset with every default filled in")
    s.add_argument("preset")
    s.set_defaults(func=cmd_show)

    for mod in ("cli_check", "cli_estimate"):
        try:
            m = __import__(f"qwen_tui.{mod}", fromlist=["add_parser"])
        except ImportError as err:
            if err.name != f"qwen_tui.{mod}":
                raise
            continue
        m.add_parser(sub)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv or (len(argv) == 1 and not argv[0].startswith("-") and argv[0].endswith((".yaml", ".yml"))):
        return cmd_tui(argv[0] if argv else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except PresetError as e:
        for line in e.problems:
            print(line, file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        _err(str(e))
        return 2


if __name__ == "__main__":
    sys.exit(main())
