"""One Level for the advice and the node checks' findings: the same ranking, the same words on disk."""

import json

import yaml

from qwen_tui.advice.core import Advice
from qwen_tui.base.levels import Level, loudest_first, worst
from qwen_tui.nodes.checks.findings import Finding


def test_levels_rank_the_same_for_advice_and_findings():
    assert worst(["info", Level.ERROR, "warning"]) is Level.ERROR
    assert worst([Level.INFO, Level.WARNING]) is Level.WARNING
    assert worst([]) is None
    items = [Advice("info", "A", "a"), Finding("warning", "B", "b"), Advice("error", "C", "c"),
             Finding("info", "D", "d")]
    assert [i.code for i in sorted(items, key=loudest_first)] == ["C", "B", "A", "D"]


def test_a_level_given_as_its_word_is_the_level():
    f = Finding("error", "X", "m", "fix it", 1, "gpu")
    assert f.level is Level.ERROR and Advice("warning", "Y", "m").level is Level.WARNING
    assert f"{f.level:7}|" == "error  |"  # the check's table pads the word, not the enum's name


def test_files_hold_the_plain_words():
    f = Finding(Level.WARNING, "X", "m", node=0, check="port")
    a = Advice(Level.ERROR, "Y", "m")
    for d in (f.to_dict(), a.to_dict()):
        assert type(d["level"]) is str
        yaml.safe_dump(d)  # a safe YAML dump takes plain str only
    assert json.loads(json.dumps(f.to_dict()))["level"] == "warning"
