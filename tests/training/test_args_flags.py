"""The worker's flags as typed groups (training.flags): one field per flag, no attribute that is not declared,
defaults and help in the fields only (the parser is generated from them), and --help as it was (every group and
flag in it)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys

import pytest

from support.paths import ROOT
from training.args import _take_defaults, build_parser, parse_args
from training.flags import (
    FLAG_GROUPS,
    DataFlags,
    FlagNotes,
    ModelFlags,
    Resolved,
    TrainFlags,
    WorkerFlags,
    field_group,
    flag_defaults,
)

BASE = ["--model_name_or_path", "m", "--data_path", "d", "--output_dir", "o"]
# Flags spelled in one group of --help for a field of another: HF's older name of --use_cpu.
ALIASES = {"--no_cuda": "train"}


def _actions(parser: argparse.ArgumentParser):
    """(group title, action) for every flag of the parser (not --help)."""
    for group in parser._action_groups:
        for action in group._group_actions:
            if action.dest != "help":
                yield group.title, action


def test_every_flag_is_one_field_of_one_group_and_every_field_a_flag():
    titles = {group.TITLE: name for name, group in FLAG_GROUPS.items()}
    owner = field_group()
    # no name in two groups: the flat name of a flag says which group holds it
    assert len(owner) == sum(len(dataclasses.fields(g)) for g in FLAG_GROUPS.values())
    seen = set()
    for title, action in _actions(build_parser()):
        assert action.dest in owner, f"{action.option_strings} has no field in training.flags"
        group = ALIASES.get(action.option_strings[0], titles.get(title))
        assert owner[action.dest] == group, f"{action.option_strings} is in --help's {title!r}, its field in {group}"
        seen.add(action.dest)
    assert seen == set(owner), f"fields that are no flag: {sorted(set(owner) - seen)}"


def test_every_flag_is_generated_from_its_field_with_the_fields_help():
    """No flag is written into the parser by hand: each one's help is its field's (or, for an HF flag accepted
    with no effect, says why), and a field's help reaches --help as it is."""
    fields = {f.name: f for group in FLAG_GROUPS.values() for f in dataclasses.fields(group)}
    for name, f in fields.items():
        meta = f.metadata
        assert meta.get("help") or meta.get("no_effect") or meta.get("hidden"), f"--{name} has no help on its field"
    for _, action in _actions(build_parser()):
        meta = fields[action.dest].metadata
        if action.option_strings[0] in ALIASES or action.option_strings[0].startswith("--no_"):
            continue  # another group's name for it, or the off spelling of a switch (its `off`)
        if meta.get("hidden"):
            assert action.help == argparse.SUPPRESS
        elif meta.get("no_effect"):
            assert action.help.endswith("no effect: " + meta["no_effect"]), action.option_strings
        else:
            assert action.help == meta["help"], action.option_strings


def test_a_flag_added_to_the_parser_alone_fails_when_the_parser_is_built():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_name_or_path")
    parser.add_argument("--new_flag", type=int)
    with pytest.raises(TypeError, match="new_flag"):
        _take_defaults(parser)


def test_defaults_come_from_the_fields():
    parser = build_parser()
    defaults = flag_defaults()
    for _, action in _actions(parser):
        if action.required:
            assert action.dest not in defaults
        else:
            assert action.default == defaults[action.dest], action.option_strings
    parsed = WorkerFlags.from_namespace(parser.parse_args(BASE))
    assert parsed == WorkerFlags(model=ModelFlags(model_name_or_path="m"), data=DataFlags(data_path="d"),
                                 train=TrainFlags(output_dir="o"))
    # a list default is fresh for every parse: resolving one run's flags cannot change the next one's
    first = parse_args(BASE + ["--report_to", "none"])
    first.lora.lora_target_modules.append("lm_head")
    assert "lm_head" not in parse_args(BASE).lora.lora_target_modules


def test_the_environment_default_is_read_when_the_parser_is_built(monkeypatch):
    monkeypatch.setenv("QWEN_TUI_NCCL_TIMEOUT", "77")
    assert parse_args(BASE).train.ddp_timeout == 77
    monkeypatch.delenv("QWEN_TUI_NCCL_TIMEOUT")
    assert parse_args(BASE).train.ddp_timeout == 1800


def test_an_undeclared_flag_can_be_neither_set_nor_read():
    flags = parse_args(BASE)
    for target in (flags, flags.train, flags.fast, flags.hf, flags.notes):
        with pytest.raises(AttributeError):
            target.expandable_why_not = "x"
    with pytest.raises(AttributeError):
        flags.train.learning_rte = 1e-4  # a typo fails instead of training at the default
    with pytest.raises(AttributeError):
        _ = flags.learning_rate  # a flat read no longer works: the flag is in its group
    assert flags.train.learning_rate == 5e-5


def test_parse_args_resolves_into_declared_fields_and_notes():
    flags = parse_args(BASE + ["--q_lora", "--lora_target_modules", "q_proj,k_proj", "v_proj", "--do_train"])
    assert isinstance(flags, WorkerFlags) and isinstance(flags.notes, FlagNotes)
    assert flags.lora.use_lora is True and flags.lora.lora_target_modules == ["q_proj", "k_proj", "v_proj"]
    assert flags.save.metrics_file.endswith("metrics.jsonl") and flags.train.per_device_eval_batch_size == 8
    assert flags.notes.hf_warnings == ["--do_train has no effect here: the worker always trains"]
    by_name = flags.by_name()
    assert by_name["learning_rate"] == 5e-5 and by_name["hf_warnings"] == flags.notes.hf_warnings
    assert len(by_name) == len(field_group()) + len(dataclasses.fields(FlagNotes))


def test_help_keeps_every_group_and_flag(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # the same width here and in the subprocess
    parser = build_parser()
    res = subprocess.run([sys.executable, "-m", "training.finetune", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0 and res.stdout == parser.format_help()
    titles = [g.title for g in parser._action_groups[2:]]
    assert titles == [group.TITLE for group in FLAG_GROUPS.values()]
    for title in titles:
        assert f"\n{title}:\n" in res.stdout
    for _, action in _actions(parser):
        if action.help != argparse.SUPPRESS:
            for option in action.option_strings:
                assert option in res.stdout


def test_what_set_up_resolves_is_its_own_record_and_the_trackers_record_it():
    """Set-up settles some flags from the run itself (shared storage, long records, the CUDA allocator): into
    Resolved, which starts from the flags as given; the flags stay as given; a tracker's configuration shows every
    flag, the settled ones as set-up settled them."""
    from training.runtime.trackers import scalar_config

    flags = parse_args(BASE + ["--save_on_each_node"])
    resolved = Resolved.of(flags)
    assert (resolved.save_on_each_node, resolved.tiled_mlp, resolved.packing_tokens) == (True, None, None)
    assert resolved.gradient_checkpointing is None and resolved.expandable_why is None
    resolved.save_on_each_node, resolved.tiled_mlp, resolved.expandable_why = False, True, "on: CUDA"
    assert flags.save.save_on_each_node is True and flags.train.tiled_mlp is None  # as the user gave them
    cfg = scalar_config(flags, resolved)
    assert (cfg["save_on_each_node"], cfg["tiled_mlp"], cfg["expandable_why"]) == (False, True, "on: CUDA")
    assert cfg["learning_rate"] == 5e-5 and cfg["hf_warnings"] == ""
    assert set(cfg) == set(field_group()) | {f.name for f in dataclasses.fields(FlagNotes)} | set(resolved.by_name())
    with pytest.raises(AttributeError):
        resolved.tiled_mlp_tokens = 1  # only what set-up settles: a slotted record too

