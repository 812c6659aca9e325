"""Experiment trackers (--report_to tensorboard|wandb|mlflow|all|none): the figures of metrics.jsonl, logged from
rank 0 through each library's own API.

Each step record's numbers go out as train/<name> (loss, learning_rate, grad_norm, tokens_per_second, ...), an eval
record's as eval/loss and eval/tokens, at the record's optimizer step; the flags go in as the run's configuration.
Every node's GPU load, as qwen-tui's monitor sees it, comes through a JSON-lines file that qwen-tui appends to
beside metrics.jsonl (--node_gpu_file; see NodeGpuFeed) and is logged at the same steps as the loss:
gpu/node<R>/gpu<I>/util (%), gpu/node<R>/gpu<I>/mem_used_gib and, for CPU-only nodes, cpu/node<R>/util.

accelerate's tracker classes are not used: they log through accelerate's logger, which refuses to run without an
accelerate state (PartialState), and creating one in this worker would set up its own view of the process group and
devices beside training.runtime.dist. The libraries' calls here are the ones those classes make.

Nothing here imports a tracker library until a tracker opens; which_trackers() checks that the named ones are
installed while the flags are parsed, so a missing package fails in seconds with the pip command to fix it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import socket
import sys
import time
from datetime import datetime

from training.flags import HfFlags, Resolved, WorkerFlags
from training.runtime.errors import InputError

log = logging.getLogger("training")

# tracker -> (module it imports, what to pip install)
KNOWN = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


def which_trackers(values: list[str], check: bool = True) -> list[str]:
    """--report_to as HF takes it (one or more words, each possibly a comma list; 'all' = every installed one,
    'none' = no tracker) -> the tracker names. check: each named one must be installed (rank 0, which logs).
    Raises InputError naming what is wrong."""
    names = [n.strip().lower() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in KNOWN and n not in ("all", "none")]
    if unknown:
        raise InputError(f"--report_to {', '.join(unknown)}: unknown tracker; choose from "
                         f"{', '.join(KNOWN)}, all or none")
    if "none" in names:
        if len(names) > 1:
            raise InputError(f"--report_to none cannot be combined with other trackers ({' '.join(values)})")
        return []
    if "all" in names:
        return [n for n, (mod, _) in KNOWN.items() if importlib.util.find_spec(mod) is not None]
    chosen = list(dict.fromkeys(names))
    for n in chosen if check else ():
        mod, pip = KNOWN[n]
        if importlib.util.find_spec(mod) is None:
            raise InputError(f"--report_to {n} needs the '{pip}' package, which {sys.executable} cannot import: "
                             f"pip install {pip}")
    if check and "mlflow" in chosen:
        _check_mlflow_store()
    return chosen


def _check_mlflow_store() -> None:
    """MLflow's default store (sqlite:///mlflow.db since MLflow 3) needs sqlalchemy, which mlflow-skinny lacks:
    without a tracking URI that would fail only once the model has loaded."""
    if os.environ.get("MLFLOW_TRACKING_URI") or importlib.util.find_spec("sqlalchemy") is not None:
        return
    raise InputError("--report_to mlflow: MLFLOW_TRACKING_URI is not set and MLflow's default sqlite store needs "
                     "sqlalchemy (pip install mlflow, not mlflow-skinny); or set MLFLOW_TRACKING_URI to your MLflow "
                     "server (http://HOST:5000)")


def default_logging_dir(output_dir: str) -> str:
    """HF's default TensorBoard directory: OUTPUT_DIR/runs/<date and time>_<host>."""
    return os.path.join(output_dir, "runs", datetime.now().strftime("%b%d_%H-%M-%S") + "_" + socket.gethostname())


def numbers(record: dict, prefix: str, skip=("step", "time", "event")) -> dict[str, float]:
    """The record's finite numbers (booleans left out) under prefix/."""
    out = {}
    for k, v in record.items():
        if k in skip or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if v == v and abs(v) != float("inf"):
            out[f"{prefix}/{k}"] = float(v)
    return out


def scalar_config(flags: WorkerFlags, resolved: Resolved) -> dict:
    """The run's configuration as a tracker can store it (strings, numbers, booleans; lists joined): every flag,
    those set-up settles as it settled them (training.flags.Resolved)."""
    cfg = {}
    for k, v in sorted((flags.by_name() | resolved.by_name()).items()):
        if isinstance(v, (list, tuple)):
            v = ",".join(map(str, v))
        if v is None or isinstance(v, (str, int, float, bool)):
            cfg[k] = v
    return cfg


class _TensorBoard:
    def __init__(self, hf: HfFlags, output_dir: str, config: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.dir = hf.logging_dir
        self.writer = SummaryWriter(self.dir)
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=1, default=str) + "\n```", 0)

    def log(self, values: dict[str, float], step: int) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, global_step=step)
        self.writer.flush()  # the run is watched while it trains

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, hf: HfFlags, output_dir: str, config: dict):
        import wandb

        # WANDB_PROJECT, WANDB_ENTITY, WANDB_MODE (offline, ...) and WANDB_DIR are read by wandb itself.
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "qwen-tui"), name=hf.run_name,
                              config=config, dir=os.environ.get("WANDB_DIR") or output_dir)
        self.dir = self.run.dir

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log({**values, "train/global_step": step}, step=step)

    def close(self) -> None:
        self.run.finish()


class _MLflow:
    def __init__(self, hf: HfFlags, output_dir: str, config: dict):
        import mlflow

        # MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME are read by mlflow, as under HF Trainer.
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME") or "qwen-tui")
        self.mlflow = mlflow
        self.run = mlflow.start_run(run_name=hf.run_name)
        self.dir = self.run.info.artifact_uri
        limit = mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
        params = [(k, v) for k, v in config.items() if len(str(v)) <= limit]
        for i in range(0, len(params), 100):  # mlflow takes at most 100 parameters a call
            mlflow.log_params(dict(params[i:i + 100]))

    def log(self, values: dict[str, float], step: int) -> None:
        # mlflow's metric names allow '/', not every other character: ours are letters, digits, _ and /.
        self.mlflow.log_metrics(values, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


OPENERS = {"tensorboard": _TensorBoard, "wandb": _WandB, "mlflow": _MLflow}


class Trackers:
    """The open trackers of rank 0; a sink of training.runtime.metrics.MetricsWriter (log_record gets every record)."""

    def __init__(self, names: list[str], hf: HfFlags, output_dir: str, config: dict,
                 gpu_feed: "NodeGpuFeed | None" = None):
        self.names = names
        self.gpu_feed = gpu_feed
        self.open: dict = {}
        for n in names:
            try:
                self.open[n] = OPENERS[n](hf, output_dir, config)
            except Exception as e:
                self.close()
                raise RuntimeError(f"--report_to {n}: the tracker could not start: {type(e).__name__}: {e}") from e
            log.info("reporting to %s (%s)", n, self.open[n].dir)

    def log_record(self, record: dict) -> None:
        event, step = record.get("event"), record.get("step")
        if step is None:
            return
        if event is None:
            values = numbers(record, "train")
            if self.gpu_feed is not None:
                values.update(self.gpu_feed.since_last())
        elif event == "eval":
            # eval/loss and eval/tokens (a DPO run's eval/rewards_* and eval/pairs too)
            values = {"eval/tokens": 0.0, **numbers({k[len("eval_"):]: v for k, v in record.items()
                                                     if k.startswith("eval_")}, "eval")}
        elif event == "end" and self.gpu_feed is not None:
            # what the monitor wrote since the last logging step (a short run may end before its next flush)
            values = self.gpu_feed.since_last()
            if not values:
                return
        else:
            return
        self.log(values, int(step))

    def log(self, values: dict[str, float], step: int) -> None:
        for name, t in self.open.items():
            try:
                t.log(values, step)
            except Exception as e:  # a tracker that fails (a full disk, a dropped service) must not end training
                log.warning("--report_to %s: logging step %d failed: %s", name, step, e)

    def close(self) -> None:
        for name, t in list(self.open.items()):
            try:
                t.close()
            except Exception as e:  # closing the others and the run's own end matter more
                log.warning("--report_to %s: closing failed: %s", name, e)
        self.open.clear()


class NodeGpuFeed:
    """What qwen-tui's monitor saw on every node, read from --node_gpu_file as it grows.

    qwen-tui appends one JSON object a line per node and flush (qwen_tui.run.watch.gpuseries): {"time", "node", "label",
    "samples", "gpus": [{"index", "util", "mem_used_mib", "mem_total_mib"}]} for a GPU node, {"time", "node",
    "label", "samples", "cpu_util"} for a CPU-only one. since_last() averages what arrived since its last call, per
    node and GPU. The file may not exist (no qwen-tui following the run): then nothing is logged."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0
        self._partial = b""

    def _new_lines(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read(1 << 22)
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")  # a line still being written waits for its end
        out = []
        for ln in lines:
            try:
                rec = json.loads(ln)
            except ValueError:
                continue  # a torn or foreign line is not a sample
            if isinstance(rec, dict) and isinstance(rec.get("node"), int):
                out.append(rec)
        return out

    def since_last(self) -> dict[str, float]:
        sums: dict[str, list[float]] = {}

        def add(key: str, v) -> None:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                sums.setdefault(key, []).append(float(v))

        for rec in self._new_lines():
            node = rec["node"]
            for g in rec.get("gpus") or []:
                if isinstance(g, dict) and isinstance(g.get("index"), int):
                    base = f"gpu/node{node}/gpu{g['index']}"
                    add(f"{base}/util", g.get("util"))
                    mem = g.get("mem_used_mib")
                    add(f"{base}/mem_used_gib", mem / 1024 if isinstance(mem, (int, float)) else None)
            add(f"cpu/node{node}/util", rec.get("cpu_util"))
        return {k: sum(v) / len(v) for k, v in sums.items()}


def open_trackers(flags: WorkerFlags, resolved: Resolved, is_main: bool) -> Trackers | None:
    """Rank 0's trackers for this run, or None (other ranks, or --report_to none). They record the whole run's
    configuration (scalar_config), so they take every flag and what set-up resolved."""
    hf = flags.hf
    if not is_main or not hf.report_to:
        return None
    t0 = time.perf_counter()
    feed = NodeGpuFeed(hf.node_gpu_file) if hf.node_gpu_file else None
    trackers = Trackers(hf.report_to, hf, flags.train.output_dir, scalar_config(flags, resolved), feed)
    log.info("trackers %s opened in %.1f s", ", ".join(hf.report_to), time.perf_counter() - t0)
    return trackers
