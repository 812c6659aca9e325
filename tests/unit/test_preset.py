"""Presets: round trip, bad values with file:line, unknown keys, non-YAML, no writes on load, atomic save."""

import hashlib
import os
import textwrap

import pytest

from qwen_tui.preset.files import dump_preset, load_preset, parse_preset, save_preset
from qwen_tui.preset.schema import PresetError
from support.paths import ROOT

GOOD = textwrap.dedent("""\
    # header line one
    # Run it: qwen-tui replay x.yaml
    version: 1
    name: t
    cluster:
      nodes:
      - host: node-a
        user: alice
        gpus: 8
      - host: node-b
        gpus: 8
    network:
      master_port: 29511
    training:
      model: Qwen/Qwen2.5-7B-Instruct
      data: /data/chat.jsonl
      method: lora
      zero_stage: 2
      per_device_train_batch_size: 2
      gradient_accumulation_steps: 4
    """)


def write(tmp_path, text, name="p.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def digest(p):
    return hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns


def problems(tmp_path, text):
    p = write(tmp_path, text)
    before = digest(p)
    with pytest.raises(PresetError) as ei:
        load_preset(p)
    assert digest(p) == before, "a failed load must not touch the file"
    return ei.value.problems, p


def test_good_preset_loads_with_derived_values(tmp_path):
    pr = load_preset(write(tmp_path, GOOD))
    assert pr.world_size == 16
    assert pr.effective_batch_size == 2 * 4 * 8 * 2
    assert pr.master_addr == "node-a"
    assert pr.cluster.nodes[0].user == "alice"


def test_round_trip_is_identical(tmp_path):
    pr = load_preset(write(tmp_path, GOOD))
    out = save_preset(pr, tmp_path / "out.yaml")
    again = load_preset(out)
    assert again == pr
    assert dump_preset(again) == dump_preset(pr)


@pytest.mark.parametrize("path", sorted((ROOT / "presets").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_presets_load_and_name_their_command(path):
    pr = load_preset(path)
    head = path.read_text().split("\nversion:")[0]
    assert f"qwen-tui replay presets/{path.name}" in head
    assert pr.name == path.stem


@pytest.mark.parametrize("old,new,field,words", [
    ("zero_stage: 2", "zero_stage: 4", "training.zero_stage", "must be 2 or 3"),
    ("gpus: 8\n  - host: node-b", "gpus: 0\n  - host: node-b", "cluster.nodes.0.gpus", "greater than or equal to 1"),
    ("master_port: 29511", "master_port: 99999", "network.master_port", "less than or equal to 65535"),
    ("method: lora", "method: qlorra", "training.method", "'full', 'lora' or 'qlora'"),
    ("per_device_train_batch_size: 2", "per_device_train_batch_size: two", "training.per_device_train_batch_size",
     "valid integer"),
    ("version: 1", "version: 7", "version", "preset version 1"),
])
def test_bad_values_name_field_and_line(tmp_path, old, new, field, words):
    text = GOOD.replace(old, new, 1)
    assert text != GOOD
    probs, p = problems(tmp_path, text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if new.splitlines()[0] in ln)
    assert any(pr.startswith(f"{p}:{line} {field}:") and words in pr for pr in probs), probs


def test_missing_required_field(tmp_path):
    probs, p = problems(tmp_path, GOOD.replace("  data: /data/chat.jsonl\n", ""))
    assert any("training.data: is required" in pr for pr in probs), probs


def test_unknown_key_suggests_near_miss(tmp_path):
    text = GOOD.replace("  method: lora", "  method: lora\n  learnig_rate: 0.1")
    probs, p = problems(tmp_path, text)
    assert probs == [f"{p}:18 training.learnig_rate: unknown key (did you mean 'learning_rate'?)"]


def test_unknown_section(tmp_path):
    probs, p = problems(tmp_path, GOOD + "netwrok:\n  master_port: 1\n")
    assert any("netwrok: unknown key (did you mean 'network'?)" in pr for pr in probs)


def test_duplicate_remote_hosts_rejected(tmp_path):
    probs, _ = problems(tmp_path, GOOD.replace("host: node-b", "host: node-a"))
    assert any("cluster.nodes.1.host" in pr and "also node 0" in pr for pr in probs), probs


def test_not_yaml_names_the_line(tmp_path):
    probs, p = problems(tmp_path, GOOD.replace("  master_port: 29511", "  master_port: [29511"))
    assert len(probs) == 1 and probs[0].startswith(f"{p}:") and "not valid YAML" in probs[0]


def test_yaml_that_is_not_a_mapping(tmp_path):
    probs, p = problems(tmp_path, "- just\n- a list\n")
    assert "must be a mapping" in probs[0]


def test_no_code_execution_from_yaml(tmp_path):
    probs, _ = problems(tmp_path, "!!python/object/apply:os.system ['touch /tmp/qwen-tui-pwned']\n")
    assert not os.path.exists("/tmp/qwen-tui-pwned")
    assert "not valid YAML" in probs[0]


def test_missing_file(tmp_path):
    with pytest.raises(PresetError, match="no such preset file"):
        load_preset(tmp_path / "nope.yaml")


def test_save_keeps_header_and_is_atomic(tmp_path, monkeypatch):
    p = write(tmp_path, GOOD)
    pr = load_preset(p)
    pr2 = pr.model_copy(update={"name": "renamed"})
    save_preset(pr2, p)
    text = p.read_text()
    assert text.startswith("# header line one\n# Run it: qwen-tui replay x.yaml\n")
    assert load_preset(p).name == "renamed"

    # a crash while writing leaves the old file whole and no temp file behind
    before = p.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        save_preset(pr, p)
    assert p.read_bytes() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["p.yaml"]


def test_new_file_gets_run_command_header(tmp_path):
    pr = load_preset(write(tmp_path, GOOD))
    out = save_preset(pr, tmp_path / "fresh.yaml")
    assert f"# Run it:   qwen-tui replay {out}" in out.read_text()


def test_control_characters_refused(tmp_path):
    probs, _ = problems(tmp_path, GOOD.replace("host: node-b", 'host: "node-b\\nrm -rf /"'))
    assert any("cluster.nodes.1.host" in pr and "control characters" in pr for pr in probs)


def test_parse_preset_without_file():
    pr = parse_preset(GOOD)
    assert pr.training.zero_stage == 2
