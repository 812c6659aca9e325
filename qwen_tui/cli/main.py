"""qwen-tui's command line. No arguments (or a preset path) opens the wizard; the
subcommands do the same work headless."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from .. import __version__
from ..base.logsetup import configure as configure_logging
from ..preset.files import load_preset
from ..preset.schema import Preset, PresetError
from ..preset.shipped import shipped_preset
from ..run.rundir import RunDirError
from . import after, check, data, estimate
from .options import HelpFormatter, examples

DEMO_PRESET = shipped_preset("local-demo.yaml")
RUNS_DIR_HELP = "where run directories live (default $QWEN_TUI_RUNS, else $XDG_STATE_HOME/qwen-tui/runs)"
VERBOSE_HELP = "log what qwen-tui does (-vv: debug, SSH included); a run directory gets the log as qwen-tui.log"
# shtab's completion hint for a preset argument: files ending in .yaml or .yml
PRESET_FILES = {"bash": "_shtab_compgen_files", "zsh": "_files -g '*.y(a|)ml'"}


def _err(msg: str) -> None:
    print(f"qwen-tui: {msg}", file=sys.stderr)


def _load(path: str) -> Preset:
    return load_preset(path)


# ------------------------------------------------------------------ commands

def cmd_replay(args: argparse.Namespace) -> int:
    from .live import prepare_and_launch
    from .slurm_inside import allocation_id

    preset = load_preset(args.preset)
    if preset.scheduler.is_slurm and not preset.cluster.nodes and allocation_id() is None:
        from rich.console import Console

        from ..run.rundir import default_runs_root
        from .slurm_batch import submit_and_follow

        root = Path(args.runs_dir).absolute() if args.runs_dir else default_runs_root()
        flags = [f for f, on in (("--skip-checks", args.skip_checks), ("--force", args.force),
                                 ("--overwrite-output", args.overwrite_output),
                                 ("--exclude-failed", args.exclude_failed)) if on]
        return submit_and_follow(preset, args.preset, root=root, dry_run=args.dry_run, console=Console(),
                                 replay_flags=flags)
    return prepare_and_launch(args.preset, dry_run=args.dry_run, runs_root=args.runs_dir,
                              accept_new_host_keys=args.accept_new_host_keys, force=args.force,
                              skip_checks=args.skip_checks, max_seconds=args.max_seconds,
                              exclude_failed=args.exclude_failed, verbose=args.verbose > 0,
                              overwrite_output=args.overwrite_output, run_id=args.run_id)


def cmd_demo(args: argparse.Namespace) -> int:
    from .live import prepare_and_launch

    if not DEMO_PRESET.exists():
        _err(f"the demo preset {DEMO_PRESET} is missing: reinstall qwen-tui (pip install qwen-tui) or run from "
             "a source checkout")
        return 2
    return prepare_and_launch(str(DEMO_PRESET), dry_run=args.dry_run, runs_root=args.runs_dir,
                              accept_new_host_keys=False, force=False, skip_checks=False,
                              max_seconds=args.max_seconds, verbose=args.verbose > 0,
                              overwrite_output=args.overwrite_output, replace_own_output=True)


def _runs_root(args: argparse.Namespace) -> Path:
    from ..run.rundir import default_runs_root

    return Path(args.runs_dir).absolute() if getattr(args, "runs_dir", None) else default_runs_root()


def cmd_attach(args: argparse.Namespace) -> int:
    from ..run.runs import RunNotFound, resolve_run
    from .live import attach

    try:
        path = resolve_run(args.run, _runs_root(args))
    except RunNotFound as e:
        _err(str(e))
        return 2
    from .slurm_batch import attach_submitted, submitted_job

    if submitted_job(path) is not None:  # a SLURM batch job: followed (or cancelled) through SLURM
        return attach_submitted(path, stop=args.stop)
    return attach(str(path), accept_new_host_keys=args.accept_new_host_keys, stop=args.stop)


def cmd_runs(args: argparse.Namespace) -> int:
    """One line per run: id, preset, state, nodes, start time, last loss (newest last, as `ls -tr`)."""
    import json
    import time

    from rich.console import Console
    from rich.table import Table

    from ..run.runs import list_runs

    root = _runs_root(args)
    runs = list_runs(root)
    if args.json:
        json.dump([r.to_dict() for r in runs], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not runs:
        print(f"no runs in {root}")
        return 0
    width = shutil.get_terminal_size().columns
    # The run id is what `attach` needs: it is never cut or wrapped; the other columns give way to it,
    # the least needed first, so the table fits the terminal rather than forcing one of 120 columns.
    cols = ["run", "state", "step", "last loss", "preset", "started", "nodes"]
    rows = []
    for r in runs:
        nodes = f"{len(r.nodes)}: " + ", ".join(r.nodes[:3]) + (" ..." if len(r.nodes) > 3 else "")
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started)) if r.started else "-"
        state = r.state if r.attempt == 1 else f"{r.state} (attempt {r.attempt})"
        rows.append({"run": r.run_id, "preset": str(r.preset or "-"), "state": state, "nodes": nodes, "started": started,
                     "step": "-" if r.step is None else str(r.step),
                     "last loss": "-" if r.last_loss is None else f"{r.last_loss:.4f}"})

    def need(names: list[str]) -> int:  # the table's width with these columns unwrapped (borders, padding)
        return 1 + sum(max(len(c), *(len(row[c]) for row in rows)) + 3 for c in names)

    shown = [c for c in cols if c in ("run", "state")]
    for c in cols[2:]:
        if need(shown + [c]) <= width:
            shown.append(c)
    shown = [c for c in ("run", "preset", "state", "nodes", "started", "step", "last loss") if c in shown]
    t = Table(title=f"runs in {root}", title_justify="left")
    for col in shown:
        t.add_column(col, justify="right" if col in ("step", "last loss") else "left", no_wrap=col == "run",
                     min_width=len(max((row[col] for row in rows), key=len)) if col == "run" else None)
    for row in rows:
        t.add_row(*(row[c] for c in shown))
    console = Console(width=max(width, need(["run"])))
    console.print(t)
    hidden = [c for c in cols if c not in shown]
    if hidden:  # wrapped to the terminal like the table
        console.print(f"({', '.join(hidden)} left out to fit {width} columns: qwen-tui runs --json has every field)",
                      markup=False, highlight=False)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from ..run.export.render import export_files
    from ..run.rundir import new_run_id

    preset = _load(args.preset)
    if args.image and args.format not in ("kubeflow", "skypilot"):
        _err(f"--image: the {args.format} format runs no container image (kubeflow and skypilot do)")
        return 2
    if args.accelerator and args.format != "skypilot":
        _err(f"--accelerator: only the skypilot format asks for a GPU type, not {args.format}")
        return 2
    run_id = new_run_id(preset.name or Path(args.preset).stem)
    try:
        files = export_files(preset, args.format, run_id=run_id, base_dir=os.getcwd(),
                             preset_file=str(Path(args.preset).absolute()), image=args.image,
                             accelerator=args.accelerator)
    except ValueError as e:  # a plan the format cannot express (export.engine_argv.ExportError names the field)
        _err(f"{args.preset}: {e}")
        return 2
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
    from ..base.atomic import write_text_atomic

    for path, text in targets.items():
        write_text_atomic(path, text, mode=0o755)
        print(f"wrote {path}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """Print the validated preset as YAML with every field, defaults included (the saved form leaves them out)."""
    import yaml

    preset = _load(args.preset)
    shown = {"version": preset.version, **preset.model_dump(mode="json")}
    sys.stdout.write(yaml.safe_dump(shown, sort_keys=False, allow_unicode=True, default_flow_style=False))
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    """Prints the shell completion script (shtab renders it from this very parser)."""
    try:
        import shtab
    except ImportError:
        _err("shell completion needs the shtab package: pip install shtab")
        return 1
    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return 0


def cmd_tui(preset: str | None) -> int:
    try:
        from ..ui.app import run_app
    except ImportError as e:
        _err(f"the wizard cannot start: {e}")
        return 1
    return run_app(preset)


# ------------------------------------------------------------------ parser

# What `qwen-tui COMMAND --help` ends with: commands a user can copy, each within 78 columns (tests/unit/
# test_cli_help.py parses each one and checks that the presets they name are shipped). Every sub-command has its
# lines here.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "replay": ("qwen-tui replay presets/local-demo.yaml",
               "qwen-tui replay presets/qwen2.5-14b-full-4node-zero3.yaml --dry-run"),
    "demo": ("qwen-tui demo", "qwen-tui demo --dry-run"),
    "attach": ("qwen-tui attach last", "qwen-tui attach last --stop"),
    "runs": ("qwen-tui runs", "qwen-tui runs --json"),
    "export": ("qwen-tui export presets/qwen2.5-7b-lora-2node-zero2.yaml --format slurm",
               "qwen-tui export presets/local-demo.yaml --format sh -o scripts/"),
    "show": ("qwen-tui show presets/local-demo.yaml",
             "qwen-tui show presets/qwen3-30b-a3b-lora-2node-zero3.yaml"),
    "check": ("qwen-tui check presets/local-demo.yaml",
              "qwen-tui check presets/qwen2.5-7b-lora-2node-zero2.yaml --out facts.json",
              "qwen-tui check presets/qwen2.5-7b-lora-2node-zero2.yaml --sync"),
    "keys": ("qwen-tui keys presets/qwen2.5-7b-lora-2node-zero2.yaml",
             "qwen-tui keys presets/qwen2.5-7b-lora-2node-zero2.yaml --accept-new-host-keys"),
    "estimate": ("qwen-tui estimate presets/qwen2.5-7b-lora-2node-zero2.yaml --gpu H100",
                 "qwen-tui estimate presets/qwen2.5-7b-lora-2node-zero2.yaml --bus-gbps 400",
                 "qwen-tui estimate presets/qwen2.5-7b-lora-2node-zero2.yaml --facts facts.json"),
    "data": ("qwen-tui data presets/local-demo.yaml",
             "qwen-tui data presets/local-demo.yaml --json"),
    "merge": ("qwen-tui merge last", "qwen-tui merge runs/RUN_ID --force"),
    "chat": ("qwen-tui chat last --prompt 'What is the capital of Chile?'", "qwen-tui chat last"),
    "completion": ('eval "$(qwen-tui completion bash)"', "qwen-tui completion zsh > ~/.zfunc/_qwen-tui"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="qwen-tui", formatter_class=HelpFormatter,
        description="Set up, check, launch and watch multi-node fine-tuning of Qwen models. "
                    "With no command (or with a preset path) it opens the wizard.",
        epilog=examples("qwen-tui demo", "qwen-tui presets/local-demo.yaml",
                        "qwen-tui check presets/local-demo.yaml", "qwen-tui COMMAND --help"),
    )
    p.add_argument("--version", action="version", version=f"qwen-tui {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def launch_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--dry-run", action="store_true", help="print each node's command and environment; launch nothing")
        sp.add_argument("--runs-dir", default=None, help=RUNS_DIR_HELP)
        sp.add_argument("--max-seconds", type=float, default=None, help="stop the run if it has not finished by then")
        sp.add_argument("--overwrite-output", action="store_true",
                        help="launch although training.output_dir holds another run's checkpoints or model (they "
                             "stay, except files the new run writes under the same names)")

    r = sub.add_parser("replay", help="run a preset headless: checks, plan, launch, live view",
                       description="Run a preset headless: checks, plan, launch, live view. In the live view Ctrl-C "
                       "stops the run on every node; d (or Ctrl-\\) detaches and leaves it running "
                       "(qwen-tui attach finds it again).")
    r.add_argument("preset", help="a preset YAML file").complete = PRESET_FILES
    launch_opts(r)
    r.add_argument("--accept-new-host-keys", action="store_true", help="trust and record host keys seen for the first time")
    r.add_argument("--force", action="store_true", help="launch although the checks found errors")
    r.add_argument("--skip-checks", action="store_true", help="launch without running the checks first")
    r.add_argument("--exclude-failed", action="store_true",
                   help="with training.restarts, relaunch without the node that failed, keeping the global batch "
                        "(as training.exclude_failed: true)")
    r.add_argument("--run-id", default=None,
                   help="the run directory's name under --runs-dir (default: a new one); the batch script of a SLURM "
                        "run passes its own, so the job takes over the directory its submission made")
    r.set_defaults(func=cmd_replay)

    d = sub.add_parser("demo", help="train the tiny model on two local 'nodes' (the local-demo preset)",
                       description="Train the tiny model on two local 'nodes' (the shipped local-demo preset: two "
                       "torchrun agents on this machine, LoRA on CPU), with the checks, the plan and the live view "
                       "of replay. Run again where it ran, it replaces its own earlier output (output/local-demo); "
                       "the output of any other run is never replaced without --overwrite-output.")
    launch_opts(d)
    d.set_defaults(func=cmd_demo)

    a = sub.add_parser("attach", help="watch (or stop) a run started earlier: a run id, 'last', or its directory",
                       description="Watch (or stop) a run started earlier. Ctrl-C, d or Ctrl-\\ detach: the run goes "
                       "on (--stop stops it). With training.restarts, a failed attempt "
                       "is relaunched by the replay or wizard that launched the run; when that one is gone (killed, or the "
                       "wizard quit), attach relaunches it and follows it to the end.")
    a.add_argument("run", metavar="RUN", help="a run id (or a unique prefix of one) from `qwen-tui runs`, 'last' "
                   "for the newest run, or a run directory")
    a.add_argument("--stop", action="store_true", help="stop every node of that run")
    a.add_argument("--accept-new-host-keys", action="store_true",
                   help="trust and record host keys seen for the first time")
    a.add_argument("--runs-dir", default=None, help=RUNS_DIR_HELP)
    a.set_defaults(func=cmd_attach)

    ls = sub.add_parser("runs", help="list the runs: id, preset, state, nodes, start time, last loss",
                        description="List the runs of the runs directory, oldest first: id, preset, state, nodes, "
                        "start time, last step and loss. Columns that do not fit the terminal are left out (said "
                        "under the table); the id never is. Each id works with attach, merge and chat.")
    ls.add_argument("--runs-dir", default=None, help=RUNS_DIR_HELP)
    ls.add_argument("--json", action="store_true", help="one JSON object per run")
    ls.set_defaults(func=cmd_runs)

    e = sub.add_parser("export", help="write SLURM, PBS or per-node shell scripts, a Kubeflow TrainJob or a SkyPilot "
                       "task that run the same plan",
                       description="Write what runs the same plan as replay would on another engine: an sbatch "
                       "script (slurm), a qsub script (pbs), one shell script per node (sh), a Kubeflow Trainer v2 "
                       "TrainJob (kubeflow) or a SkyPilot task (skypilot). Secrets are read from the environment (or "
                       "the engine's secrets) when it runs, never written into it; the scripts do not relaunch "
                       "after a failure.")
    e.add_argument("preset", help="a preset YAML file").complete = PRESET_FILES
    e.add_argument("--format", choices=("slurm", "pbs", "sh", "kubeflow", "skypilot"), default="sh",
                   help="slurm: an sbatch script; pbs: a qsub script; sh: one script per node; kubeflow: a Kubeflow "
                        "Trainer v2 TrainJob (kubectl apply -f); skypilot: a SkyPilot task (sky launch) (default: sh)")
    e.add_argument("-o", "--output", help="file (slurm, pbs, kubeflow, skypilot) or directory (sh); default stdout "
                   "for one file")
    e.add_argument("--image", help="kubeflow, skypilot: the container image the nodes run (it must hold qwen-tui's "
                   "worker); default: the engine's own")
    e.add_argument("--accelerator", help="skypilot: the GPU type to ask for (e.g. H100); default: any of H100, H200, "
                   "A100-80GB")
    e.set_defaults(func=cmd_export)

    s = sub.add_parser("show", help="print a preset with every default filled in",
                       description="Print a preset as YAML with every field, the defaults it leaves out filled in, "
                       "after validating it (an error names the file, line and field). It writes nothing; the "
                       "output reads back as the same preset.")
    s.add_argument("preset", help="a preset YAML file").complete = PRESET_FILES
    s.set_defaults(func=cmd_show)

    for command in (check, estimate, data, after):
        command.add_parser(sub)

    c = sub.add_parser("completion", help="print the shell completion script for bash or zsh",
                       description="Print the shell completion script for bash or zsh: commands, options and preset "
                       "files complete with Tab. bash: put the first example in ~/.bashrc. zsh: write the script "
                       "as _qwen-tui in a directory on $fpath (the second example), then run compinit.")
    c.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete for")
    c.set_defaults(func=cmd_completion)

    for name, sp in sub.choices.items():  # -v also after the command: `qwen-tui replay x.yaml -v`
        sp.formatter_class = HelpFormatter  # wrapped to the terminal, the examples kept as written
        if name in EXAMPLES and not sp.epilog:
            sp.epilog = examples(*EXAMPLES[name])
        if name != "completion":
            sp.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=VERBOSE_HELP)
        for action in sp._actions:  # every preset argument completes .yaml files
            if action.dest == "preset" and not hasattr(action, "complete"):
                action.complete = PRESET_FILES
    return p


def _leading_verbosity(argv: list[str]) -> tuple[int, list[str]]:
    """-v flags before anything else: `qwen-tui -v` and `qwen-tui -vv PRESET` still open the wizard."""
    n = 0
    while argv and (argv[0] == "--verbose" or (len(argv[0]) > 1 and argv[0] == "-" + "v" * (len(argv[0]) - 1))):
        n += 1 if argv[0] == "--verbose" else len(argv[0]) - 1
        argv = argv[1:]
    return n, argv


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    verbosity, rest = _leading_verbosity(list(argv))
    if not rest or (len(rest) == 1 and not rest[0].startswith("-") and rest[0].endswith((".yaml", ".yml"))):
        configure_logging(verbosity, stderr=False)  # the screen owns stderr; the run directory gets the log
        return cmd_tui(rest[0] if rest else None)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    configure_logging(args.verbose)
    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's teardown
        return rc
    except KeyboardInterrupt:  # Ctrl-C where nothing runs yet (connecting, checking): no traceback
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `qwen-tui estimate --json | head`: the reader left; stop quietly as Unix tools do, and keep Python
        # from failing again on the final flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by the broken pipe
    except PresetError as e:
        for line in e.problems:
            print(line, file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        _err(str(e))
        return 2
    except RunDirError as e:  # a run directory that is not one, or corrupt: the user's input, one line
        _err(str(e))
        return 2


if __name__ == "__main__":
    sys.exit(main())
