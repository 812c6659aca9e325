"""The run's data files beside training.data (eval_data, a mixture's paths, a dataset_info.json and the file its
entry names) are looked at on every node by the real probe, compared with the master's, and copied by the sync:
a node that lacks one, or holds another version, is named before launch, not by its worker mid-run.

Two "nodes" on this machine (two local nodes with workdirs of their own), each probed by the probe program the
SSH and SLURM nodes run; the comparison and the sync are the ones `qwen-tui check --sync` runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from qwen_tui.advice.rules import advise
from qwen_tui.cluster.facts import ClusterFacts
from qwen_tui.nodes.checks.probe import data_path, probe_node
from qwen_tui.nodes.checks.runner import consistency
from qwen_tui.nodes.sync import sync
from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.preset.schema import Preset

CHAT = '{"messages": [{"role": "user", "content": "hi %d"}, {"role": "assistant", "content": "hello"}]}\n'


def _write(root: Path, rel: str, text: str) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)


def _preset(a: Path, b: Path) -> Preset:
    node = {"gpus": 1, "python": sys.executable}
    return Preset.model_validate({
        "cluster": {"nodes": [{"host": "localhost", "workdir": str(a), **node},
                              {"host": "127.0.0.1", "workdir": str(b), **node}]},
        "training": {"model": "builtin:tiny", "device": "cpu", "output_dir": "out", "eval_data": "eval.jsonl",
                     "datasets": [{"path": "data/a.jsonl", "weight": 2},
                                  {"dataset_info": "info/dataset_info.json", "name": "chats"}]}})


def _data(preset: Preset, facts: ClusterFacts) -> set[tuple[int | None, str, str]]:
    """The comparison's findings about data files (a CPU-only node is a finding of its own): node, code, field."""
    return {(f.node, f.code, f.message.split(" ")[1]) for f in consistency(preset, facts) if f.check == "data"}


def _probe(preset: Preset) -> ClusterFacts:
    facts = ClusterFacts()
    for i in (0, 1):
        facts.nodes[i], _ = probe_node(LocalTransport(f"node{i}"), preset, i, timeout=120)
    return facts


def test_every_data_file_of_the_run_is_compared_with_the_masters_and_synced(tmp_path, monkeypatch):
    monkeypatch.setenv("QWEN_TUI_CACHE", str(tmp_path / "cache"))  # the probe's digest cache
    a, b = tmp_path / "master", tmp_path / "node1"
    info = json.dumps({"chats": {"file_name": "chats.jsonl"}})
    for rel, text in (("data/a.jsonl", CHAT % 1), ("info/dataset_info.json", info), ("info/chats.jsonl", CHAT % 2),
                      ("eval.jsonl", CHAT % 3)):
        _write(a, rel, text)
    # node 1: another version of the mixture's first file, the same dataset_info.json without the file its entry
    # names, no eval file
    _write(b, "data/a.jsonl", CHAT % 9)
    _write(b, "info/dataset_info.json", info)
    preset = _preset(a, b)
    facts = _probe(preset)
    assert sorted(facts.nodes[0].data_files) == ["datasets.0.path", "datasets.1.dataset_info",
                                                 "datasets.1.file_name", "eval_data"]
    assert facts.nodes[0].data_files["datasets.1.file_name"].path == str(a / "info" / "chats.jsonl")
    found = _data(preset, facts)
    assert found == {(1, "DATA_DIFFERS", "training.datasets.0.path"),
                     (1, "DATA_MISSING", "training.datasets.1.file_name"),
                     (1, "DATA_MISSING", "training.eval_data")}, found
    # the wizard's live advice says the same from the same facts
    advice = {(x.code, x.node) for x in advise(preset, facts) if x.code.startswith("DATA_")}
    assert advice == {("DATA_DIFFERS", 1), ("DATA_MISSING", 1)}, advice
    # the facts survive the round trip the run directory's facts.json makes
    assert ClusterFacts.from_dict(facts.to_dict()).nodes[1].data_files == facts.nodes[1].data_files

    transports = {0: LocalTransport("node0"), 1: LocalTransport("node1")}
    res = sync(preset, transports, facts, code=False)
    acts = {x.kind: x.action for x in res[1]}
    assert acts == {"datasets.0.path": "differs (left untouched)", "datasets.1.dataset_info": "same",
                    "datasets.1.file_name": "copied", "eval_data": "copied"}, acts
    assert (b / "info" / "chats.jsonl").read_text() == CHAT % 2 and (b / "eval.jsonl").read_text() == CHAT % 3
    again = _probe(preset)
    assert _data(preset, again) == {(1, "DATA_DIFFERS", "training.datasets.0.path")}  # replaced only with consent
    res = sync(preset, transports, again, code=False, overwrite=True)
    assert {x.kind: x.action for x in res[1]}["datasets.0.path"] == "copied"
    assert (b / "data" / "a.jsonl").read_text() == CHAT % 1


def test_a_relative_data_path_is_a_file_to_look_for_not_a_hub_id():
    # data names the hub only as hf:ORG/NAME, so data/chat.jsonl is the file the worker opens
    assert data_path("data/chat.jsonl") == "data/chat.jsonl" and data_path("/d/x.parquet") == "/d/x.parquet"
    assert data_path("hf:acme/chats") is None and data_path("builtin:demo-chat") is None and data_path(None) is None
