"""Where each node keeps checkpoints and the final model, and whether it has room (qwen_tui/plan/outputs.py), as
`check` reports it and the plan summary shows it."""

import io
import textwrap

from rich.console import Console

from qwen_tui.cli.live import print_plan
from qwen_tui.cluster.facts import ClusterFacts, NodeFacts
from qwen_tui.model.spec import resolve_model
from qwen_tui.nodes.checks.runner import output_findings
from qwen_tui.plan import outputs
from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.files import parse_preset

GiB = 2 ** 30


def _preset(shared=False, **training):
    extra = "".join(f"  {k}: {v}\n" for k, v in training.items())
    return parse_preset(textwrap.dedent("""\
        version: 1
        cluster:
          shared_storage: %s
          nodes:
          - {host: 10.0.0.1, gpus: 8, workdir: /w0, python: /venv/bin/python}
          - {host: 10.0.0.2, gpus: 8, workdir: /w1, python: /venv/bin/python}
        training:
          model: Qwen/Qwen2.5-7B-Instruct
          data: /data/chat.jsonl
    """ % ("true" if shared else "false")) + extra)


def test_places_per_node_without_shared_storage_and_one_with_it():
    own = outputs.places(_preset(output_dir="out"))
    assert [(i, w) for i, _, w in own] == [(0, "/w0/out  (this node's own copy)"), (1, "/w1/out  (this node's own copy)")]
    one = outputs.places(_preset(shared=True, output_dir="/shared/out"))
    assert len(one) == 1 and one[0][2].startswith("/shared/out  (one copy")


def test_sizes_follow_the_model_method_and_zero_shards():
    spec = resolve_model("Qwen/Qwen2.5-7B-Instruct")
    n = spec.total_params
    full = outputs.output_need(_preset(method="full", zero_stage=2, save_total_limit=2), spec, 1)
    # bf16 weights + this node's 8 of 16 ranks' fp32 master and Adam moments; 2 kept + 1 being written
    assert full.checkpoint_bytes == 2 * n + 12 * n * 8 // 16 and full.checkpoints == 3 and full.final_bytes == 2 * n
    shared = outputs.output_need(_preset(shared=True, method="full", zero_stage=2, save_total_limit=2), spec, 0)
    assert shared.checkpoint_bytes == 2 * n + 12 * n  # one copy holds every shard
    lora = outputs.output_need(_preset(method="lora", save_total_limit=1), spec, 0)
    trainable = spec.lora_params(64)
    assert lora.checkpoint_bytes == 4 * trainable + 12 * trainable * 8 // 16 and lora.final_bytes == 4 * trainable
    assert lora.total_bytes < full.total_bytes / 20
    merged = outputs.output_need(_preset(method="lora", merge_lora="true"), spec, 0)
    assert merged.final_bytes == 4 * trainable + 2 * n
    assert outputs.output_need(_preset(save_strategy="'no'"), spec, 0).checkpoints == 0
    unbounded = outputs.output_need(_preset(save_total_limit="null", max_steps=1000, save_steps=100), spec, 0)
    assert unbounded.checkpoints == 10


def test_check_names_the_node_without_room_and_shows_where_the_others_keep_theirs():
    p = _preset(method="full", zero_stage=2, output_dir="out")
    facts = ClusterFacts(nodes={0: NodeFacts(disk_free_bytes=500 * GiB), 1: NodeFacts(disk_free_bytes=40 * GiB)})
    found = output_findings(p, facts, probed={0, 1})
    by = {(f.node, f.code): f for f in found}
    assert set(by) == {(0, "OUTPUT_PLACE"), (1, "OUTPUT_NO_ROOM")}
    err = by[(1, "OUTPUT_NO_ROOM")]
    assert err.level == "error" and err.check == "disk"
    assert "10.0.0.2: checkpoints and the final model need ~" in err.message and "/w1/out" in err.message
    assert "40.0 GiB free" in err.message and "3 checkpoints of" in err.message and "save_total_limit" in err.fix
    assert "/w0/out  (this node's own copy)" in by[(0, "OUTPUT_PLACE")].message
    assert "500.0 GiB free" in by[(0, "OUTPUT_PLACE")].message
    # shared storage: one copy, judged once, on the master
    ps = _preset(shared=True, method="full", zero_stage=2, output_dir="/shared/out")
    found = output_findings(ps, ClusterFacts(nodes={0: NodeFacts(disk_free_bytes=40 * GiB),
                                                    1: NodeFacts(disk_free_bytes=1)}), probed={0, 1})
    assert [(f.node, f.code) for f in found] == [(0, "OUTPUT_NO_ROOM")]


def test_an_unknown_model_still_shows_the_places_without_judging_room():
    p = _preset(output_dir="out")
    p.training.model = "someone/not-a-qwen"
    found = output_findings(p, ClusterFacts(nodes={0: NodeFacts(disk_free_bytes=1), 1: NodeFacts(disk_free_bytes=1)}),
                            probed={0, 1})
    assert [f.code for f in found] == ["OUTPUT_PLACE", "OUTPUT_PLACE"] and "needed" not in found[0].message


def test_the_plan_summary_shows_each_nodes_output_dir():
    buf = io.StringIO()
    print_plan(make_plan(_preset(output_dir="out"), run_id="r", local_run_dir="/runs/r"),
               Console(file=buf, width=200))
    text = buf.getvalue()
    assert "node 0 (10.0.0.1): /w0/out  (this node's own copy)" in text
    assert "node 1 (10.0.0.2): /w1/out  (this node's own copy)" in text
    buf = io.StringIO()
    print_plan(make_plan(_preset(shared=True, output_dir="/s/out"), run_id="r", local_run_dir="/runs/r"),
               Console(file=buf, width=200))
    assert "node 0 (10.0.0.1): /s/out  (one copy, written by rank 0" in buf.getvalue()
    assert "node 1 (10.0.0.2)" not in buf.getvalue().split("checkpoints and final model")[-1]


def test_replay_shows_a_line_a_node_and_the_whole_plan_with_verbose_or_dry_run():
    """The live replay prints one line a node before its live view (forty lines of environment buried the
    advice); -v and --dry-run print every node's environment and command line."""
    plan = make_plan(_preset(output_dir="out"), run_id="r", local_run_dir="/runs/r")
    texts = {}
    for full in (False, True):
        buf = io.StringIO()
        print_plan(plan, Console(file=buf, width=200), full=full)
        texts[full] = buf.getvalue()
    short, whole = texts[False], texts[True]
    assert "node 0: 10.0.0.1, 8 process(es), workdir /w0" in short and "node 1: 10.0.0.2" in short
    assert "MASTER_ADDR=" not in short and "torch.distributed.run" not in short and "add -v" in short
    assert f"model {plan.nodes[0].argv[plan.nodes[0].argv.index('--model_name_or_path') + 1]}, data " in short
    assert "MASTER_ADDR=" in whole and whole.count("torch.distributed.run") == 2
    assert "checkpoints and final model" in short and "checkpoints and final model" in whole
