"""After a run: merge its adapter into the base, and talk to the result.

The heavy part runs on the master node (node 0, whose rank 0 saved the model),
with the Python and workdir the run used: `python -m training.merge` and
`python -m training.chat`, each printing JSON on stdout. This process imports
no torch. Where things are comes from the run directory: plan.json (node 0's
python, workdir and the output directory), preset.yaml (the base model, the
data) and, when the master is local, the worker's own end record in
metrics.jsonl (the absolute output directory).
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...nodes.transport.protocol import Transport
from ...plan.container import with_stdin
from ...preset.files import load_preset
from ...preset.schema import Preset
from ..rundir import RunDir
from ..states import RunState
from .json_tool import run_json_tool

MERGE_TIMEOUT_S = 3600.0  # a 72B merge on CPU takes a while; still bounded
CHAT_TIMEOUT_S = 900.0


class AfterRunError(RuntimeError):
    """The run's result cannot be used (not finished, not found) or the node's command failed."""


@dataclass
class RunResult:
    run_dir: Path
    preset: Preset
    python: str  # node 0's interpreter, as the run used it
    workdir: str  # node 0's working directory
    output_dir: str  # absolute, or relative to workdir
    finished: bool | None  # the worker's end record says ok (None: the metrics are on a remote master)
    container: list[str] = field(default_factory=list)  # node 0's container command, as the run used it

    @property
    def master(self):
        return self.preset.cluster.nodes[0]

    @property
    def merged_dir(self) -> str:
        return posixpath.join(self.output_dir, "merged")


def _end_record(metrics: Path) -> dict[str, Any] | None:
    if not metrics.is_file():
        return None
    end = None
    for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(rec, dict) and rec.get("event") == "end":
            end = rec
    return end


def locate(run_dir: str | Path) -> RunResult:
    rd = RunDir(Path(run_dir))
    plan = rd.read_plan()  # FileNotFoundError names the directory
    preset_file = rd.path / "preset.yaml"
    if not preset_file.is_file():
        raise AfterRunError(f"{rd.path}: no preset.yaml in the run directory")
    preset = load_preset(preset_file)
    node0 = plan.nodes[0]
    out = plan.output_dir
    finished: bool | None = None
    if node0.local:
        end = _end_record(Path(plan.metrics_file))
        if end is not None:
            finished = end.get("status") == RunState.OK
            out = end.get("output_dir") or out
        elif rd.read_state().get("status") == RunState.RUNNING:
            raise AfterRunError(f"{rd.path}: the run has not finished yet (qwen-tui attach {rd.path} follows it)")
        else:
            finished = False
        if finished is False:
            state = rd.read_state()
            raise AfterRunError(f"{rd.path}: the run did not finish training"
                                + (f" ({state['message']})" if state.get("message") else "")
                                + ": there is no final model to use")
    return RunResult(run_dir=rd.path, preset=preset, python=node0.argv[0], workdir=node0.workdir, output_dir=out,
                     finished=finished, container=list(node0.container))


def _run(res: RunResult, transport: Transport, module: str, args: list[str], timeout: float,
         input: bytes | None = None) -> dict[str, Any]:
    # in the run's image where it trained in one: its Python has the worker's packages, its mounts the outputs
    box = with_stdin(res.container) if input is not None else res.container
    return run_json_tool(transport, [*box, res.python, "-m", module, *args], cwd=res.workdir,
                         timeout=timeout,
                         what=module, error=AfterRunError, input=input)


def merge(res: RunResult, transport: Transport, *, force: bool = False, dtype: str = "auto",
          timeout: float = MERGE_TIMEOUT_S) -> dict[str, Any]:
    """Merge on node 0 into OUTPUT_DIR/merged, checked there by reloading against the adapter on the run's
    evaluation data (else its training data)."""
    t = res.preset.training
    args = [res.output_dir, "--base", t.model, "--dtype", dtype, "--model_max_length", str(t.model_max_length)]
    check = t.eval_data or t.data
    if check and t.stage == "sft":  # chat records; a DPO run's pairs and a mixture get the probe's logits check
        args += ["--check_data", check]
    if force:
        args.append("--force")
    return _run(res, transport, "training.merge", args, timeout)


def chat(res: RunResult, transport: Transport, prompt: str, *, system: str | None = None,
         max_new_tokens: int = 256, temperature: float = 0.0, device: str = "auto",
         timeout: float = CHAT_TIMEOUT_S) -> dict[str, Any]:
    """One reply of the run's model (OUTPUT_DIR/merged when there, else the adapter on its base)."""
    if not prompt.strip():
        raise AfterRunError("the prompt is empty")
    # "--prompt=TEXT": a prompt that starts with "-" must not read as a flag
    args = [res.output_dir, "--base", res.preset.training.model, f"--prompt={prompt}",
            "--max_new_tokens", str(max_new_tokens), "--temperature", repr(temperature), "--device", device]
    if system:
        args.append(f"--system={system}")
    return _run(res, transport, "training.chat", args, timeout)


def chat_turn(res: RunResult, transport: Transport, messages: list[dict[str, str]], *, max_new_tokens: int = 256,
              temperature: float = 0.0, device: str = "auto", timeout: float = CHAT_TIMEOUT_S) -> dict[str, Any]:
    """The model's reply to a whole conversation ([{"role", "content"}, ...], the user's turn last), through
    training.chat --stdin: one JSON line in, the reply out (the model loads for each turn, over SSH as locally)."""
    if not messages or messages[-1].get("role") != "user" or not str(messages[-1].get("content", "")).strip():
        raise AfterRunError("the conversation must end with a non-empty user message")
    args = [res.output_dir, "--base", res.preset.training.model, "--stdin", "--max_new_tokens", str(max_new_tokens),
            "--temperature", repr(temperature), "--device", device]
    line = (json.dumps({"messages": messages}) + "\n").encode()
    rep = _run(res, transport, "training.chat", args, timeout, input=line)
    if "error" in rep:
        raise AfterRunError(f"training.chat: {rep['error']}")
    return rep
