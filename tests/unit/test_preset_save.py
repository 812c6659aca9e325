"""Saving an edited preset keeps what the user wrote: comments, key order, explicit defaults, spellings."""

import re
import textwrap

from qwen_tui.preset.files import load_preset, save_preset

USER = textwrap.dedent("""\
    # my cluster: two boxes under the desk
    version: 1
    name: desk   # shown in the wizard
    cluster:
      nodes:                      # node 0 is the master
        - {host: box-1, user: me, gpus: 2}
        - host: box-2             # the noisy one
          gpus: 2
      connect_timeout: 10.0       # the default, written on purpose
    training:
      # model first, then the data
      model: Qwen/Qwen2.5-7B-Instruct
      data: /data/chat.jsonl
      learning_rate: 2e-4         # Qwen's LoRA value
      method: lora
      precision: bf16             # default, kept explicit
      zero_stage: 2
    """)


def edit_and_save(tmp_path, text=USER, **training):
    p = tmp_path / "desk.yaml"
    p.write_text(text)
    pr = load_preset(p)
    edited = pr.model_copy(update={"training": pr.training.model_copy(update=training)})
    save_preset(edited, p)
    return p, p.read_text(), edited


def test_edit_keeps_comments_order_and_explicit_values(tmp_path):
    p, text, edited = edit_and_save(tmp_path, per_device_train_batch_size=4, method="full")
    assert load_preset(p) == edited
    for kept in ("# my cluster: two boxes under the desk\n", "name: desk   # shown in the wizard\n",
                 "# node 0 is the master", "- {host: box-1, user: me, gpus: 2}", "# the noisy one",
                 "connect_timeout: 10.0       # the default, written on purpose",
                 "  # model first, then the data\n", "learning_rate: 2e-4         # Qwen's LoRA value",
                 "precision: bf16             # default, kept explicit"):
        assert kept in text, (kept, text)
    assert "method: full" in text and "method: lora" not in text
    assert "per_device_train_batch_size: 4" in text  # a new explicit value, at the end of its section
    lines = text.splitlines()
    assert lines.index("  zero_stage: 2") < lines.index("  per_device_train_batch_size: 4")
    assert [ln.split(":")[0] for ln in lines if ln and not ln.startswith((" ", "#"))] == [
        "version", "name", "cluster", "training"]  # no section added, none reordered


def test_changed_value_keeps_its_comment(tmp_path):
    _, text, _ = edit_and_save(tmp_path, learning_rate=1e-4)
    assert re.search(r"\n  learning_rate: 0\.0001 +# Qwen's LoRA value\n", text), text


def test_unchanged_save_is_byte_identical(tmp_path):
    p = tmp_path / "desk.yaml"
    p.write_text(USER)
    save_preset(load_preset(p), p)
    assert p.read_text() == USER


def test_node_list_edits_keep_the_other_nodes_text(tmp_path):
    p = tmp_path / "desk.yaml"
    p.write_text(USER)
    pr = load_preset(p)
    nodes = list(pr.cluster.nodes) + [pr.cluster.nodes[1].model_copy(update={"host": "box-3"})]
    save_preset(pr.model_copy(update={"cluster": pr.cluster.model_copy(update={"nodes": nodes})}), p)
    text = p.read_text()
    assert "- {host: box-1, user: me, gpus: 2}" in text and "# the noisy one" in text and "box-3" in text
    assert [n.host for n in load_preset(p).cluster.nodes] == ["box-1", "box-2", "box-3"]
    pr = load_preset(p)
    save_preset(pr.model_copy(update={"cluster": pr.cluster.model_copy(update={"nodes": pr.cluster.nodes[:1]})}),
                p)
    assert [n.host for n in load_preset(p).cluster.nodes] == ["box-1"]
    assert "# my cluster: two boxes under the desk" in p.read_text()


def test_an_added_section_holds_only_what_was_set(tmp_path):
    p = tmp_path / "desk.yaml"
    p.write_text(USER)
    pr = load_preset(p)
    save_preset(pr.model_copy(update={"network": pr.network.model_copy(update={"master_port": 29600})}), p)
    text = p.read_text()
    assert "network:\n  master_port: 29600\n" in text and "backend" not in text
    assert load_preset(p).network.master_port == 29600


def test_untouched_nulls_keep_their_spelling_and_a_new_null_says_null(tmp_path):
    """`zero_stage: null` once came back as `zero_stage:` after an edit elsewhere; `~` and a bare key likewise."""
    text = USER.replace("  zero_stage: 2\n", "  zero_stage: null   # plain DDP\n") + \
        "network:\n  interface: ~\n  nccl_ib_disable:\n"
    p, out, edited = edit_and_save(tmp_path, text, learning_rate=1e-4)
    assert "  zero_stage: null   # plain DDP\n" in out
    assert "  interface: ~\n" in out and "  nccl_ib_disable:\n" in out
    assert [ln for ln in out.splitlines() if "learning_rate" not in ln] == \
        [ln for ln in text.splitlines() if "learning_rate" not in ln]
    p, out, edited = edit_and_save(tmp_path, USER, zero_stage=None)  # set to null by the edit: written as null
    assert "  zero_stage: null\n" in out and load_preset(p) == edited
