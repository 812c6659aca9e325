"""The GPU proof: in one call of at most 10 minutes, everything qwen-tui has proven only on CPU ranks or one GPU,
run on the GPUs present (1, 2, 4 or 8), one table with a verdict a line, and a JSON file.

    python bench/gpu_proof.py --out DIR                   # on the GPU machine: every line that applies
    python bench/gpu_proof.py --cpu --out DIR             # no GPU: the multi-process lines on 2 CPU ranks (gloo)
    python bench/gpu_proof.py --list                      # the lines, what each needs
    python bench/gpu_proof.py --fetch-wheels .whl         # here, before a call: the packages the GPU image lacks

On 2+ GPUs: NCCL all-reduce and all-gather bus bandwidth (nccl-tests' busbw) fed to the estimator; scaling
efficiency 1 -> N GPUs measured beside the estimator's prediction with that bandwidth; `qwen-tui check` on two
"nodes" reached over SSH (an sshd per node on this machine, set up and taken down by the proof) with its
rehearsal, and the NCCL transport it names; qwen-tui's launcher (`qwen-tui replay`) running two torchrun agents
over SSH, each with its half of the GPUs; ZeRO-2 and ZeRO-3 on 2 GPUs reproducing 1 GPU's loss and grad-norm curve
on a small real-shaped model (Qwen2.5-0.5B's shape); MoE under ZeRO-3 with leaf modules; sequence parallelism 2
reproducing one GPU's loss; the 4-bit base sharded by ZeRO-3. On any GPU: the fast path's tokens/s and MFU for
7B LoRA, 1.5B full, MoE LoRA and the longest single record, each beside the figure the README states (read
from the bench/results file it cites), flagged `slow` when more than 10% under it; 7B LoRA DPO on the same
sequences, beside 7B LoRA SFT's speed in the same call.

Verdicts: pass, fail, slow, skipped (always with the reason: no GPU, too few GPUs, a package missing, the time
budget, a line it needs that did not run). Nothing that did not run is ever `pass`. The lines run in the order
of bench/proof_lines.LINES; on several GPUs, lines that need fewer GPUs than the machine has run side by side
on disjoint GPUs; a line that cannot finish within the budget (--budget-s, 540 s by default: a device call
is cut at 600) is skipped, saying so.

The GPU image has torch, transformers, peft and accelerate but not deepspeed, liger-kernel, bitsandbytes,
pydantic or paramiko: --fetch-wheels DIR downloads them here (and Debian's openssh-server, in case the image has
no sshd); the call then carries DIR and installs it first, as the device tool's README says:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && python3 bench/gpu_proof.py --carry .whl --out $OUT/proof
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import proof_lines as pl  # noqa: E402

# What the worker and qwen-tui import everywhere, beside each line's own needs.
ALWAYS = ("torch", "transformers", "peft", "accelerate", "pydantic", "yaml")
# The packages the GPU image lacks (KINDS.md), pinned as constraints.txt pins them where it does: --fetch-wheels.
WHEELS = ("deepspeed==0.19.8", "hjson", "liger-kernel==0.8.5", "bitsandbytes==0.50.2", "nvidia-cudnn-frontend",
          "pydantic==2.14.4", "pydantic-core", "annotated-types", "typing-inspection", "paramiko==5.1.0", "bcrypt",
          "pynacl", "invoke", "cryptography==50.0.2", "cffi", "pycparser", "ruamel.yaml==0.19.1", "shtab==1.13.0")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_35_x86_64")
# NVLink multicast stays off on the lent multi-GPU machines, in every process the proof starts (KINDS.md).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def missing_modules(names) -> dict[str, str]:
    """module -> why it cannot be imported (only the ones that cannot)."""
    out = {}
    for m in names:
        try:
            if importlib.util.find_spec(m) is None:
                out[m] = "not installed"
        except (ImportError, ValueError) as e:
            out[m] = str(e)
    return out


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def versions() -> dict:
    out = {"python": platform.python_version(), "host": platform.node()}
    for m in ("torch", "transformers", "peft", "deepspeed", "liger_kernel", "bitsandbytes"):
        spec = importlib.util.find_spec(m)
        if spec is None:
            out[m] = "missing"
            continue
        try:
            from importlib.metadata import version

            out[m] = version(m.replace("_", "-"))
        except Exception as e:  # a module without distribution metadata: say so, do not guess
            out[m] = f"? ({type(e).__name__})"
    try:
        import torch

        out["cuda"] = torch.version.cuda
        out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
            if torch.cuda.is_available() else []
    except ImportError:
        out["gpus"] = []
    return out


def skip_reason(line: pl.Line, *, cpu: bool, ngpus: int, missing: dict, selected: bool) -> str:
    """Why this line cannot run here ("" when it can)."""
    if cpu and line.gpu_only:
        return "needs CUDA GPUs (--cpu: CPU ranks cannot answer it)"
    if not cpu:
        if ngpus == 0:
            return "no CUDA GPU here (--cpu runs the multi-process lines on CPU ranks)"
        need = 2 if line.gpus == 0 else line.gpus
        if ngpus < need:
            return f"needs {need}+ GPUs, {ngpus} here"
    if not selected:
        return "not selected (--only / --skip)"
    lacking = [m for m in (*ALWAYS, *line.needs) if m in missing and not (cpu and m in ("liger_kernel",))]
    if lacking:
        return (f"{', '.join(lacking)} not importable: carry the wheels (python bench/gpu_proof.py --fetch-wheels "
                ".whl here, then install them first in the call)")
    return ""


class Scheduler:
    """Runs the lines in order, each on the GPUs it needs: a line starts when its GPUs are free and its `after`
    lines have finished; lines on disjoint GPUs run side by side (CPU mode: one at a time). A line that could not
    finish before the deadline (its estimate) is skipped, saying so."""

    def __init__(self, ctx: pl.Context, lines: list[pl.Line], parallel: bool, own_process: set[str]):
        self.ctx, self.lines, self.parallel, self.own = ctx, lines, parallel, own_process
        self.free = list(range(ctx.ngpus)) if not ctx.cpu else []
        self.lock = threading.Condition()
        self.running: dict[str, threading.Thread] = {}

    def _finish(self, line: pl.Line, res: pl.Result, t0: float, gpus: list[int]) -> None:
        res.title, res.seconds, res.gpus = line.title, time.monotonic() - t0, gpus
        with self.lock:
            self.ctx.results[line.name] = res
            self.free = sorted(self.free + gpus)
            self.running.pop(line.name, None)
            self.lock.notify_all()
        print(f"{line.name}: {res.verdict} ({res.seconds:.0f} s) {res.detail}", flush=True)

    def _run(self, line: pl.Line, gpus: list[int]) -> None:
        t0 = time.monotonic()
        try:
            if line.name in self.own:
                res = run_in_own_process(self.ctx, line, gpus)
            else:
                ctx = pl.Context(**{**self.ctx.__dict__, "gpu_ids": gpus})
                ctx.results, ctx.shared = self.ctx.results, self.ctx.shared  # one shared state for all lines
                res = line.run(ctx)
        except pl.LineFailed as e:
            res = pl.Result(line.name, line.title, "fail", str(e))
        except Exception as e:  # a line's bug is its verdict, never the end of the proof
            res = pl.Result(line.name, line.title, "fail", f"{type(e).__name__}: {e}"[:600])
        self._finish(line, res, t0, gpus)

    def run(self, ready: list[pl.Line]) -> None:
        pending = list(ready)
        while pending or self.running:
            with self.lock:
                started = False
                for line in list(pending):
                    done = all(a in self.ctx.results for a in line.after if a in {x.name for x in self.lines})
                    if not done:
                        continue
                    want = 0 if self.ctx.cpu else line.want(self.ctx.ngpus)
                    if self.ctx.cpu and self.running:
                        break  # CPU ranks: one line at a time
                    if len(self.free) < want or (not self.parallel and self.running):
                        if line.gpus == 0:
                            break  # a line of all the GPUs waits for them with the lines after it: none overtakes
                        continue
                    if self.ctx.left() < line.est_s and not self.ctx.cpu:
                        pending.remove(line)
                        self.ctx.results[line.name] = pl.Result(
                            line.name, line.title, "skipped",
                            f"budget: ~{line.est_s:.0f} s needed, {max(0.0, self.ctx.left()):.0f} s left")
                        continue
                    gpus, self.free = self.free[:want], self.free[want:]
                    pending.remove(line)
                    t = threading.Thread(target=self._run, args=(line, gpus), name=line.name, daemon=True)
                    self.running[line.name] = t
                    t.start()
                    started = True
                if not started and (pending or self.running):
                    self.lock.wait(timeout=1.0)


def run_in_own_process(ctx: pl.Context, line: pl.Line, gpus: list[int]) -> pl.Result:
    """A line whose code sets process-wide state (os.environ, the benchmarks' modules) runs in a child of its own,
    so lines side by side never see each other's GPUs."""
    out = ctx.scratch / f"result-{line.name}.json"
    argv = [sys.executable, str(Path(__file__)), "--run-line", line.name, "--gpu-ids", ",".join(map(str, gpus)),
            "--result", str(out), "--scratch", str(ctx.scratch), "--out", str(ctx.out), "--log", str(ctx.log),
            "--budget-s", str(max(10.0, ctx.left()))]
    res = subprocess.run(argv, env=ctx.env, cwd=ROOT, timeout=max(10.0, ctx.left() + 30), capture_output=True,
                         text=True)
    if not out.is_file():
        raise pl.LineFailed(f"exit {res.returncode}: {pl.tail(res.stdout + res.stderr)}")
    d = json.loads(out.read_text())
    return pl.Result(d["line"], d["title"], d["verdict"], d["detail"], d["measured"], d["reference"])


def table(results: list[pl.Result]) -> str:
    rows = ["| line | verdict | seconds | GPUs | what was seen |", "| --- | --- | ---: | --- | --- |"]
    for r in results:
        detail = r.detail.replace("|", "/").replace("\n", " ")
        gpus = ",".join(map(str, r.gpus)) if r.gpus else "-"
        rows.append(f"| {r.line} | **{r.verdict}** | {r.seconds:.0f} | {gpus} | {detail} |")
    return "\n".join(rows)


def summary(results: list[pl.Result]) -> dict[str, int]:
    return {v: sum(r.verdict == v for r in results) for v in pl.VERDICTS}


def fetch_wheels(dest: Path, leave_out: set[str]) -> int:
    """Downloads (here, where PyPI and Debian answer) what the GPU image lacks, for its Python 3.12 on x86-64.
    A call carries 64 MiB with the checkout: bitsandbytes (41 MiB) and nvidia-cudnn-frontend (11 MiB) do not both
    fit beside the rest, so cuDNN's frontend is left out unless asked for (the speed lines then run FlashAttention
    2, about 3% slower end to end on these shapes, and say so)."""
    dest.mkdir(parents=True, exist_ok=True)
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    rc = 0
    for spec in WHEELS:
        if spec.split("==")[0] in leave_out:
            print(f"{spec}: left out (--leave-out)")
            continue
        if spec.startswith("deepspeed"):  # an sdist only: built here into a pure-Python wheel, its ops left out
            cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), spec]
            env = {**os.environ, "DS_BUILD_OPS": "0"}
        else:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
                   "3.12", "--implementation", "cp", *plat, "-d", str(dest), spec]
            env = None
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        print(f"{spec}: {'ok' if res.returncode == 0 else 'FAILED ' + pl.tail(res.stderr)}", flush=True)
        rc = rc or res.returncode
    if shutil.which("apt-get"):  # Debian's sshd, in case the image has none (proof_sshd unpacks it)
        res = subprocess.run(["apt-get", "download", "openssh-server"], cwd=dest, capture_output=True, text=True,
                             timeout=300)
        for deb in dest.glob("openssh-server_*.deb"):  # a plain name: no '%' or '+' in what travels
            deb.rename(dest / "openssh-server_amd64.deb")
        print(f"openssh-server (.deb): {'ok' if res.returncode == 0 else 'FAILED ' + pl.tail(res.stderr)}")
    total = sum(f.stat().st_size for f in dest.iterdir())
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=60).stdout.split(b"\0")
    tree = sum((ROOT / f.decode()).stat().st_size for f in tracked if f and (ROOT / f.decode()).is_file())
    room = 64 * 2**20 - tree
    print(f"{dest}: {len(list(dest.iterdir()))} files, {total / 2**20:.1f} MiB; the checkout {tree / 2**20:.1f} MiB: "
          f"{'fits' if total <= room else 'DOES NOT FIT'} the 64 MiB a call carries")
    return rc or (0 if total <= room else 1)


def base_env(cpu: bool) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if not cpu:
        for k, v in MULTICAST_OFF.items():
            env.setdefault(k, v)
    return env


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", default=None, help="folder for gpu_proof.json, gpu_proof.md and gpu_proof.log")
    p.add_argument("--budget-s", type=float, default=540.0, help="seconds the whole proof may take (default 540)")
    p.add_argument("--cpu", action="store_true", help="no GPUs: the multi-process lines on 2 CPU ranks (gloo)")
    p.add_argument("--only", default="", help="comma-separated lines to run (the others are reported skipped)")
    p.add_argument("--skip", default="", help="comma-separated lines not to run")
    p.add_argument("--carry", default=None, help="the folder carried with the call (.whl): Debian's sshd package")
    p.add_argument("--list", action="store_true", help="print the lines and what each needs, run nothing")
    p.add_argument("--fetch-wheels", metavar="DIR", help="download the packages the GPU image lacks into DIR")
    p.add_argument("--leave-out", default="nvidia-cudnn-frontend",
                   help="with --fetch-wheels: packages not to fetch (default nvidia-cudnn-frontend: with bitsandbytes "
                        "it would not fit the 64 MiB a call carries)")
    p.add_argument("--run-line", help=argparse.SUPPRESS)
    p.add_argument("--gpu-ids", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--scratch", help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    names = [x.name for x in pl.LINES]
    for opt in ("only", "skip"):
        bad = [x for x in getattr(args, opt).split(",") if x and x not in names]
        if bad:
            p.error(f"--{opt}: unknown line(s) {', '.join(bad)}; the lines: {', '.join(names)}")
    if args.fetch_wheels:
        return fetch_wheels(Path(args.fetch_wheels), {x for x in args.leave_out.split(",") if x})
    if args.list:
        for x in pl.LINES:
            need = "all GPUs (2+)" if x.gpus == 0 else f"{x.gpus} GPU{'s' if x.gpus > 1 else ''}"
            print(f"{x.name:22} {need:14} {'GPU only' if x.gpu_only else 'GPU or --cpu':13} ~{x.est_s:4.0f} s  "
                  f"{x.title}")
        return 0

    t_start = time.monotonic()
    deadline = t_start + args.budget_s
    cpu = args.cpu
    if args.run_line:  # one line in a process of its own (Scheduler.run_in_own_process)
        line = next(x for x in pl.LINES if x.name == args.run_line)
        ctx = pl.Context(out=Path(args.out), scratch=Path(args.scratch), cpu=False, ngpus=gpu_count(),
                         deadline=deadline, env=base_env(False), log=Path(args.log),
                         gpu_ids=[int(g) for g in args.gpu_ids.split(",") if g],
                         visible=[x for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()])
        try:
            res = line.run(ctx)
        except pl.LineFailed as e:
            res = pl.Result(line.name, line.title, "fail", str(e))
        except Exception as e:  # the benchmark's own error (a timeout it does not catch): the line's verdict
            res = pl.Result(line.name, line.title, "fail", f"{type(e).__name__}: {e}"[:600])
        res.title = line.title
        Path(args.result).write_text(json.dumps(res.to_dict()))
        return 0

    out = Path(args.out or f"/tmp/gpu_proof-{datetime.date.today()}")
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="gpu-proof-"))
    ngpus = 0 if cpu else gpu_count()
    env = base_env(cpu)
    missing = missing_modules({m for x in pl.LINES for m in x.needs} | set(ALWAYS) | {"paramiko"})
    visible = [x for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    ctx = pl.Context(out=out, scratch=scratch, cpu=cpu, ngpus=ngpus, deadline=deadline, env=env,
                     log=out / "gpu_proof.log", carry=Path(args.carry) if args.carry else None, visible=visible)
    ctx.log.write_text("")
    only = {x for x in args.only.split(",") if x}
    skip = {x for x in args.skip.split(",") if x}
    info = versions()
    print(f"GPU proof: {'CPU ranks (gloo)' if cpu else f'{ngpus} GPU(s)'}; budget {args.budget_s:.0f} s; "
          f"missing: {', '.join(missing) or 'nothing'}", flush=True)
    ready = []
    for x in pl.LINES:
        why = skip_reason(x, cpu=cpu, ngpus=ngpus, missing=missing,
                          selected=(not only or x.name in only) and x.name not in skip)
        if why:
            ctx.results[x.name] = pl.Result(x.name, x.title, "skipped", why)
        else:
            ready.append(x)
    own = {x.name for x in pl.LINES if x.name.startswith("speed-")}
    Scheduler(ctx, pl.LINES, parallel=not cpu and ngpus > 1, own_process=own).run(ready)
    results = [ctx.results[x.name] for x in pl.LINES]
    wall = time.monotonic() - t_start
    head = (f"GPU proof {datetime.date.today()} on {', '.join(info.get('gpus') or []) or 'CPU ranks (gloo)'}; "
            f"torch {info.get('torch')}, transformers {info.get('transformers')}, deepspeed {info.get('deepspeed')}; "
            f"{wall:.0f} s of a {args.budget_s:.0f} s budget")
    md = head + "\n\n" + table(results) + "\n"
    counts = summary(results)
    data = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "mode": "cpu" if cpu else "gpu",
            "gpus": ngpus, "budget_s": args.budget_s, "wall_s": round(wall, 1), "versions": info,
            "missing": missing, "summary": counts, "lines": [r.to_dict() for r in results]}
    (out / "gpu_proof.json").write_text(json.dumps(data, indent=1, default=str))
    (out / "gpu_proof.md").write_text(md)
    print(md)
    print(", ".join(f"{n} {v}" for v, n in counts.items()))
    shutil.rmtree(scratch, ignore_errors=True)
    return 0 if counts["fail"] == 0 and counts["slow"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
