"""--report_to: TensorBoard, W&B (offline) and MLflow (file store) get the same figures as metrics.jsonl from a
real tiny training run, with every node's GPU series from qwen-tui's monitor beside the loss; --eval_strategy
epoch evaluates at each epoch's end."""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import ROOT
from support.worker import Run, assert_ok, demo_records, one_process_threads, write_jsonl
from training.args import parse_args
from training.runtime.errors import InputError

BASE = ["--model_name_or_path", "m", "--data_path", "d", "--output_dir", "o"]


def test_report_to_takes_hfs_spellings(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    assert parse_args(BASE).hf.report_to == []
    assert parse_args(BASE + ["--report_to", "none"]).hf.report_to == []
    assert parse_args(BASE + ["--report_to", "tensorboard,wandb"]).hf.report_to == ["tensorboard", "wandb"]
    assert parse_args(BASE + ["--report_to", "wandb", "TensorBoard", "wandb"]).hf.report_to == ["wandb", "tensorboard"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    # all: every one installed (all three are, here)
    assert parse_args(BASE + ["--report_to", "all"]).hf.report_to == ["tensorboard", "wandb", "mlflow"]
    args = parse_args(BASE + ["--report_to", "tensorboard", "--run_name", "exp1"])
    assert args.notes.hf_warnings == [] and args.hf.run_name == "exp1"
    assert Path(args.hf.logging_dir).parent == Path("o/runs")  # HF's default: OUTPUT_DIR/runs/DATE_HOST
    assert parse_args(BASE + ["--logging_dir", "tb"]).hf.logging_dir == "tb"
    with pytest.raises(InputError, match="--report_to tensorbord: unknown tracker"):
        parse_args(BASE + ["--report_to", "tensorbord"])
    with pytest.raises(InputError, match="none cannot be combined"):
        parse_args(BASE + ["--report_to", "none,wandb"])
    import importlib.util

    if importlib.util.find_spec("sqlalchemy") is None:  # mlflow-skinny: no default store, said before training
        monkeypatch.delenv("MLFLOW_TRACKING_URI")
        with pytest.raises(InputError, match="--report_to mlflow: MLFLOW_TRACKING_URI is not set"):
            parse_args(BASE + ["--report_to", "mlflow"])


BLOCK_WANDB = """
import sys
sys.modules["wandb"] = None  # Python's own way to make a package unimportable: as if wandb were not installed
from training.finetune import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_missing_tracker_package_exits_2_before_anything_is_written(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0"}
    res = subprocess.run([sys.executable, "-c", BLOCK_WANDB, "--model_name_or_path", "builtin:tiny", "--data_path",
                          "builtin:demo-chat", "--output_dir", str(out), "--report_to", "tensorboard,wandb"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "--report_to wandb needs the 'wandb' package" in res.stderr and "pip install wandb" in res.stderr
    assert "torch" not in res.stderr  # failed while parsing flags, before the model or torch
    assert not out.exists()
    # another rank does not log, so it does not need the package
    env["RANK"] = "1"
    proc = subprocess.run([sys.executable, "-c", BLOCK_WANDB.replace("from training.finetune import main",
                                                                     "from training.args import parse_args as main")
                           .replace("sys.exit(main(sys.argv[1:]))", "print(main(sys.argv[1:]).hf.report_to)"),
                           *BASE, "--report_to", "wandb"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "['wandb']", proc.stderr[-2000:]


def wandb_history(run_dir: Path) -> list[dict]:
    """The history rows of an offline W&B run, read from its transaction log (run-ID.wandb): a header, then
    records in 32 KiB blocks (4-byte checksum, 2-byte length, 1-byte type: full, first, middle, last), each
    record a wandb_internal Record protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(str(run_dir / "run-*.wandb"))
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf, rows = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            if rec.WhichOneof("record_type") == "history":
                rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item})
    return rows


@pytest.mark.slow
def test_trackers_get_the_metrics_and_every_nodes_gpus_from_a_real_run(tmp_path, tiny_model):
    """Two epochs of full fine-tuning of the tiny model (6 steps each) reporting to all three trackers, with
    --eval_strategy epoch and a gpus.jsonl as qwen-tui's monitor writes it (real H200 rows for node 0, a CPU-only
    node 1). Every tracker holds the loss of metrics.jsonl at every step; the loss goes down; TensorBoard's event
    file holds the per-node series beside the loss; the evaluations come at steps 6 and 12 only."""
    from qwen_tui.nodes.transport.local import LocalTransport
    from qwen_tui.run.watch.gpumon import NodeSample
    from qwen_tui.run.watch.gpuseries import GpuSeriesWriter
    from support.gpu_stream import stream_ticks

    recs = demo_records()
    data = write_jsonl(tmp_path / "train.jsonl", recs[:24])
    evald = write_jsonl(tmp_path / "eval.jsonl", recs[-16:])
    out = tmp_path / "out"
    out.mkdir()
    writer = GpuSeriesWriter(LocalTransport(), str(out / "gpus.jsonl"), {0: "gpu-a", 1: "cpu-b"})
    for tick in stream_ticks():
        writer.add(NodeSample(rank=0, gpus=tick))
    writer.add(NodeSample(rank=1, cpu_util_pct=42.0))
    assert writer.flush() == 2

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": one_process_threads(), "WANDB_MODE": "offline",
           "WANDB_DIR": str(tmp_path / "wandb"), "WANDB_SILENT": "true",
           "MLFLOW_TRACKING_URI": f"file:{tmp_path / 'mlruns'}", "MLFLOW_ALLOW_FILE_STORE": "true"}
    (tmp_path / "wandb").mkdir()
    flags = ["--model_name_or_path", str(tiny_model), "--data_path", str(data), "--eval_data_path", str(evald),
             "--output_dir", str(out), "--per_device_train_batch_size", "4", "--model_max_length", "128",
             "--num_train_epochs", "2", "--learning_rate", "2e-3", "--eval_strategy", "epoch",
             "--save_strategy", "no", "--report_to", "tensorboard,wandb,mlflow", "--run_name", "tiny-trackers",
             "--logging_dir", str(out / "tb")]
    res = subprocess.run([sys.executable, "-m", "training.finetune", *flags], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=480)
    run = Run(res.returncode, res.stdout, res.stderr, out)
    assert_ok(run)
    assert "has no effect" not in res.stderr
    losses = run.losses()
    assert sorted(losses) == list(range(1, 13))
    assert losses[12] < losses[1] - 0.5  # the loss went down
    assert [e["step"] for e in run.event("eval")] == [6, 12]  # each epoch's end, and no second final eval

    # TensorBoard: the event file holds the loss and the per-node series at the training steps
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (event_file,) = glob.glob(str(out / "tb" / "events.out.tfevents.*"))
    ea = EventAccumulator(event_file)
    ea.Reload()
    tb_loss = {e.step: e.value for e in ea.Scalars("train/loss")}
    assert tb_loss.keys() == losses.keys()
    assert all(tb_loss[s] == pytest.approx(losses[s], rel=1e-6) for s in losses)
    for tag in ("train/learning_rate", "train/grad_norm", "train/tokens_per_second", "eval/loss"):
        assert tag in ea.Tags()["scalars"], ea.Tags()["scalars"]
    assert [e.step for e in ea.Scalars("eval/loss")] == [6, 12]
    utils = [t[0].util_pct for t in stream_ticks()]
    (gpu,) = ea.Scalars("gpu/node0/gpu0/util")
    assert gpu.step == 1 and gpu.value == pytest.approx(sum(utils) / len(utils))
    assert [(e.step, e.value) for e in ea.Scalars("cpu/node1/util")] == [(1, 42.0)]

    # W&B, offline: the run's own transaction log
    (wb_run,) = glob.glob(str(tmp_path / "wandb" / "wandb" / "offline-run-*"))
    rows = wandb_history(Path(wb_run))
    wb_loss = {r["train/global_step"]: r["train/loss"] for r in rows if "train/loss" in r}
    assert wb_loss == pytest.approx(losses)
    assert any(r.get("gpu/node0/gpu0/util") == pytest.approx(sum(utils) / len(utils)) for r in rows)

    # MLflow, file store
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    client = MlflowClient()
    (mrun,) = client.search_runs([client.get_experiment_by_name("qwen-tui").experiment_id])
    assert mrun.info.run_name == "tiny-trackers" and mrun.data.params["learning_rate"] == "0.002"
    ml_loss = {m.step: m.value for m in client.get_metric_history(mrun.info.run_id, "train/loss")}
    assert ml_loss == pytest.approx(losses)
