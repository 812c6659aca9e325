"""The plain parts under the wizard's first-day fixes: hostfile lines checked one by one, host names,
refusals in plain words, and a preset whose only problem is an unknown key opened without it."""

from __future__ import annotations

import pytest

from qwen_tui.base.field_words import plain, plain_message
from qwen_tui.nodes.hostlists import host_problem, parse_hostfile
from qwen_tui.preset.lenient import load_preset_keeping_known
from qwen_tui.preset.schema import PresetError


def test_hostfile_names_every_bad_line_and_imports_nothing():
    good = "gpu-1 slots=8\n10.0.0.2 slots=4  # the second\n\n# c\nfe80::1%eth0 max_slots=2\nbox\n"
    assert parse_hostfile(good) == [{"host": "gpu-1", "gpus": 8}, {"host": "10.0.0.2", "gpus": 4},
                                    {"host": "fe80::1%eth0", "gpus": 2}, {"host": "box"}]
    with pytest.raises(ValueError) as e:
        parse_hostfile("ok slots=1\nbad_host! slots=x\nn2 slots=x\nn3 foo\nn4 slots=65\n-n5\n")
    lines = str(e.value).splitlines()
    assert lines[1:] == ["line 2: bad_host! slots=x: 'bad_host!' is not a host name or address (it holds '!')",
                         "line 3: n2 slots=x: slots must be a whole number from 1 to 64, got 'x'",
                         "line 4: n3 foo: 'foo' is not slots=N",
                         "line 5: n4 slots=65: slots must be a whole number from 1 to 64, got '65'",
                         "line 6: -n5: '-n5' starts with '-': ssh would read it as an option"]


@pytest.mark.parametrize("host,ok", [("gpu-node-1", True), ("node.example.org", True), ("10.0.0.1", True),
                                     ("::1", True), ("my_alias", True), ("bad host", False), ("me@gpu", False),
                                     ("gpu;rm", False), ("", False), ("x/y", False)])
def test_host_problem(host, ok):
    assert (host_problem(host) == "") is ok, host_problem(host)


def test_pydantic_messages_in_plain_words_naming_the_field():
    assert plain_message("Input should be a valid integer, unable to parse string as an integer") == \
        "must be a whole number"
    assert plain("training.learning_rate", "Input should be a valid number, unable to parse string as a number",
                 "fast", {"training.learning_rate": "learning rate"}) == \
        "learning rate: must be a number (like 0.0002 or 2e-4), got 'fast'"
    assert plain("cluster.nodes.2.port", "Input should be less than or equal to 65535", None, {"port": "port"}) == \
        "node 2 port: must be at most 65535"
    assert plain("training.method", "Input should be 'full', 'lora' or 'qlora'", "x") == \
        "training.method: must be one of 'full', 'lora' or 'qlora', got 'x'"
    assert plain_message("must be 2 or 3 (or null for plain DDP), got 4") == \
        "must be 2 or 3 (or null for plain DDP), got 4"  # already plain: as it was


def test_an_unknown_key_opens_without_it_and_other_errors_still_refuse(tmp_path):
    p = tmp_path / "typo.yaml"
    p.write_text("name: typo\ncluster:\n  nodes:\n    - host: localhost\n      gpu: 2\ntraining:\n"
                 "  model: builtin:tiny\n  data: builtin:demo-chat\n  learning_rat: 0.01\n")
    preset, problems = load_preset_keeping_known(p)
    assert preset.name == "typo" and preset.training.learning_rate == 2e-4
    assert problems == [f"{p}:5 cluster.nodes.0.gpu: unknown key (did you mean 'gpus'?)",
                        f"{p}:9 training.learning_rat: unknown key (did you mean 'learning_rate'?)"]
    p.write_text(p.read_text().replace("learning_rat: 0.01", "learning_rate: fast"))
    with pytest.raises(PresetError) as e:  # a bad value as well: refused as before, nothing guessed
        load_preset_keeping_known(p)
    assert any("learning_rate" in ln for ln in e.value.problems)


def test_an_unknown_key_beside_a_rule_across_fields_refuses_with_the_first_refusal(tmp_path):
    # A rule across fields (eval_steps needs eval_data) is only checked once every field is valid, so the
    # first load names only the unknown key; with it dropped the rule refuses, and that is said as a refusal.
    p = tmp_path / "typo.yaml"
    p.write_text("name: typo\ncluster:\n  nodes:\n    - host: localhost\n      gpus: 2\ntraining:\n"
                 "  model: builtin:tiny\n  data: builtin:demo-chat\n  learning_rat: 0.01\n  eval_steps: 5\n")
    with pytest.raises(PresetError) as e:
        load_preset_keeping_known(p)
    assert any("learning_rat" in ln for ln in e.value.problems)
