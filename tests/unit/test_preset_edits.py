"""Preset.with_changes: the one edit by dotted path that the wizard's fields and the advice
fixes share. A refused value names its path; a path that names no field is a KeyError; the
original is never changed; fields left unset stay unset. And Preset.batch_formula."""

import pytest

from qwen_tui.preset.schema import FieldError, Preset, PresetError


def preset(**cluster) -> Preset:
    return Preset.model_validate({"cluster": {"nodes": [{"host": "a", "gpus": 4}, {"host": "b", "gpus": 4}], **cluster},
                                  "training": {"model": "builtin:tiny", "data": "d.jsonl"}})


def test_a_refused_value_names_its_dotted_path_and_leaves_the_preset_alone():
    p = preset()
    with pytest.raises(PresetError) as e:
        p.with_changes({"training.zero_stage": 4, "cluster.nodes.1.gpus": 0})
    paths = {fe.path for fe in e.value.field_errors}
    assert paths == {"training.zero_stage", "cluster.nodes.1.gpus"}, e.value.field_errors
    assert all(isinstance(fe, FieldError) and fe.message for fe in e.value.field_errors)
    assert p.training.zero_stage == 2 and p.cluster.nodes[1].gpus == 4


def test_a_model_level_rule_is_placed_on_the_path_its_message_names():
    with pytest.raises(PresetError) as e:
        preset().with_changes({"cluster.nodes.1.host": "a"})  # the same host twice
    (fe,) = e.value.field_errors
    assert fe.path == "cluster.nodes.1.host" and "also node 0" in fe.message


def test_unknown_paths_are_key_errors_and_lists_take_indices():
    p = preset()
    with pytest.raises(KeyError):
        p.with_changes({"training.no_such_field": 1})
    with pytest.raises(KeyError):
        p.get_path("cluster.nodes.first.host")
    with pytest.raises(IndexError):
        p.get_path("cluster.nodes.5.host")
    q = p.with_changes({"cluster.nodes.1.gpus": 8, "network.master_port": 29999})
    assert q.get_path("cluster.nodes.1.gpus") == 8 and q.network.master_port == 29999
    assert q.network.model_fields_set == {"master_port"}
    assert "python" not in q.cluster.nodes[0].model_fields_set


def test_a_changed_list_value_is_copied_not_shared():
    nodes = [{"host": "x"}, {"host": "y"}]
    q = preset().with_changes({"cluster.nodes": nodes})
    nodes[0]["host"] = "changed-after"
    assert [n.host for n in q.cluster.nodes] == ["x", "y"]


def test_batch_formula_says_how_the_effective_batch_comes_about():
    p = preset().with_changes({"training.per_device_train_batch_size": 2, "training.gradient_accumulation_steps": 3})
    assert p.batch_formula == "2 per device x 3 accumulation x 4 GPUs per node x 2 nodes = 48"
    mixed = p.with_changes({"cluster.nodes.1.gpus": 2})
    assert mixed.batch_formula == "2 per device x 3 accumulation x 6 GPUs in all = 36"
    assert mixed.effective_batch_size == 36
