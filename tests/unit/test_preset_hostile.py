"""Hostile preset files end in exit 2 with one `file:line field: problem` line and the
file unchanged; saving through a symbolic link updates the link's target."""

import os
import re
from pathlib import Path

import pytest

from qwen_tui.cli.main import main
from qwen_tui.preset.files import load_preset, save_preset

DEMO = (Path(__file__).resolve().parents[2] / "presets" / "local-demo.yaml").read_text()

BOMB = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else 'x'}]\n" for i in range(8))

CASES = {
    "deep_list": (DEMO + "x: " + "[" * 50000 + "\n", r":\d+ x: nested more than 64 levels deep"),
    "deep_map": (DEMO + "x: " + "{a: " * 20000 + "\n", r":\d+ x\.a\.a\.a\.\.\.\.\.a\.a: nested more than 64"),
    "huge_int": (DEMO.replace("training:\n", "training:\n  seed: " + "7" * 5000 + "\n", 1),
                 r":\d+ training\.seed: a number of 5000 digits"),
    "duplicate": (DEMO + "training:\n  data: /etc/passwd\n", r":(\d+) training: duplicate key \(first on line (\d+)"),
    "name_newline": ('name: "demo\\nrm -rf"\n' + re.sub(r"(?m)^name:.*\n", "", DEMO),
                     r":1 name: must not contain control characters"),
    "name_escape": ('name: "demo\\e[2J"\n' + re.sub(r"(?m)^name:.*\n", "", DEMO),
                    r":1 name: must not contain control characters"),
    "alias_bomb": (BOMB + DEMO, r":\d+ l\d: expands to more than 100,000 values"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_preset_exits_2_with_one_line_and_file_unchanged(tmp_path, capsys, case):
    text, pattern = CASES[case]
    f = tmp_path / f"{case}.yaml"
    f.write_text(text)
    before = f.read_bytes()
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"{f}:"), err
    m = re.search(pattern, err[0])
    assert m, err
    if case == "duplicate":
        assert int(m.group(1)) > int(m.group(2))  # both lines named
    assert f.read_bytes() == before


def test_saving_through_a_symlink_updates_the_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "real" / "p.yaml"
    target.parent.mkdir()
    target.write_text(DEMO)
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    p = load_preset(link)
    p.training.max_steps = 77
    save_preset(p, link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert load_preset(target).training.max_steps == 77
    assert not [x for x in os.listdir(tmp_path) if x.startswith(".")]  # no temp file left beside the link
