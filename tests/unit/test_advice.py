"""Every rule, triggered and not triggered; fixes apply to a new, valid preset."""

import pytest

from qwen_tui.advice.rules import RULES, Advice, Fix, advise, apply_fix
from qwen_tui.cluster.facts import GPU, ClusterFacts, FileFact, LinkFacts, NodeFacts
from qwen_tui.preset.schema import Preset


def preset(nodes=2, gpus=8, **training):
    t = dict(model="Qwen/Qwen2.5-7B-Instruct", data="/data/chat.jsonl", method="lora", zero_stage=2,
             model_max_length=2048, per_device_train_batch_size=1, gradient_accumulation_steps=8,
             gradient_checkpointing=True)
    net = training.pop("network", {})
    cluster = training.pop("cluster", {})
    t.update(training)
    return Preset.model_validate({
        "cluster": {"nodes": [{"host": f"gpu{i}", "gpus": gpus} for i in range(nodes)], "shared_storage": True,
                    **cluster},
        "network": net, "training": t})


def gpu_node(i=0, name="NVIDIA H100 80GB HBM3", n=8, mib=81559, **kw):
    return NodeFacts(hostname=f"gpu{i}", gpus=[GPU(j, name, mib) for j in range(n)], **kw)


def facts(nodes=2, **kw):
    return ClusterFacts(nodes={i: gpu_node(i) for i in range(nodes)}, **kw)


def codes(p, f=None, **kw):
    return [a.code for a in advise(p, f, **kw)]


# a baseline that triggers nothing: 7B LoRA, plain DDP, 2 x 8 H100, effective batch 128, fast link
def test_clean_preset_has_no_advice():
    f = facts(links={1: LinkFacts(port_reachable=True, bandwidth_gbps=100)}, shared_storage=True, master_port_free=True)
    # checkpointing is needed at micro-batch 4 x 4096 tokens; without it the baseline would get CKPT_UNNEEDED.
    # ZeRO-2 would get ZERO_NOT_NEEDED: the model fits without it, and DeepSpeed turns the fast path off.
    p = preset(per_device_train_batch_size=4, gradient_accumulation_steps=2, model_max_length=4096, zero_stage=None)
    # FP8's auto runs this 7B LoRA's frozen base in FP8 on the H100 (1.17x measured with checkpointing): an info
    assert [(a.code, a.level) for a in advise(p, f)] == [("FP8_ON", "info")]
    assert advise(p.with_changes({"training.fp8": "off"}), f) == []


def test_every_rule_is_registered_and_pure():
    assert len(RULES) >= 15
    p = preset()
    before = p.model_dump()
    advise(p, facts(), gpu="H100", bandwidth_gbps=1)
    assert p.model_dump() == before


# ---------------------------------------------------------------- memory

def test_oom_with_largest_fitting_micro_batch():
    p = preset(method="full", zero_stage=2, per_device_train_batch_size=16, gradient_accumulation_steps=1,
               gradient_checkpointing=False)
    adv = {a.code: a for a in advise(p, gpu="H100")}
    oom = adv["OOM"]
    assert oom.level == "error" and "GiB" in oom.message and "79.6" in oom.message
    assert oom.fix is not None
    fixed = apply_fix(p, oom.fix)
    assert "OOM" not in codes(fixed, gpu="H100")


def test_oom_not_triggered_when_it_fits_or_on_cpu():
    assert "OOM" not in codes(preset(), gpu="H200")
    p = preset(method="full", zero_stage=None, per_device_train_batch_size=64, device="cpu")
    assert "OOM" not in codes(p, gpu="H100")
    cpu_facts = ClusterFacts(nodes={0: NodeFacts(gpus=[]), 1: NodeFacts(gpus=[])})
    assert "OOM" not in codes(preset(method="full", zero_stage=None, per_device_train_batch_size=64), cpu_facts)


def test_oom_uses_smallest_gpu_from_facts():
    f = ClusterFacts(nodes={0: gpu_node(0, "NVIDIA H200", mib=143771), 1: gpu_node(1, "NVIDIA A10", mib=23028)})
    adv = [a for a in advise(preset(per_device_train_batch_size=4, model_max_length=4096), f) if a.code == "OOM"]
    assert adv and "node 1" in adv[0].message


def test_memory_tight():
    p = preset(method="lora", per_device_train_batch_size=4, gradient_checkpointing=True, model_max_length=4096)
    from qwen_tui.advice.rules import make_context

    total = make_context(p, gpu="H100").memory().total
    assert "MEMORY_TIGHT" in codes(p, gpu_memory_gib=total / 0.95)
    assert "MEMORY_TIGHT" not in codes(p, gpu_memory_gib=total / 0.5)


def test_ckpt_unneeded():
    p = preset(per_device_train_batch_size=1, model_max_length=1024, gradient_checkpointing=True)
    adv = [a for a in advise(p, gpu="H200") if a.code == "CKPT_UNNEEDED"]
    assert adv and "faster" in adv[0].message and adv[0].fix.changes == {"training.gradient_checkpointing": False}
    assert "CKPT_UNNEEDED" not in codes(preset(gradient_checkpointing=False), gpu="H200")
    # long batches need it: 7B LoRA at 4 x 8192 without checkpointing does not fit an H100
    assert "CKPT_UNNEEDED" not in codes(preset(per_device_train_batch_size=4, model_max_length=8192), gpu="H100")


def test_zero_not_needed_where_ddp_fits_and_is_faster():
    """LoRA fits every GPU without ZeRO: ZeRO-3 only costs speed (it gathers the frozen base in every pass; 0.64x
    plain DDP measured on an H200). The fix is plain DDP (the offload goes too: it needs ZeRO), and the fixed
    preset gets no such advice."""
    f = facts(links={1: LinkFacts(port_reachable=True, bandwidth_gbps=100)})
    p = preset(per_device_train_batch_size=4, gradient_accumulation_steps=2, model_max_length=4096, offload="optimizer",
               zero_stage=3)
    adv = [a for a in advise(p, f) if a.code == "ZERO_NOT_NEEDED"]
    assert adv and adv[0].level == "warning" and "ZeRO-3 with CPU offload gathers every layer's weights" in adv[0].message
    assert "x faster" in adv[0].message and "GiB of 79.6 GiB" in adv[0].message
    assert adv[0].fix.changes == {"training.zero_stage": None, "training.offload": "none"}
    fixed = apply_fix(p, adv[0].fix)
    assert fixed.training.zero_stage is None and "ZERO_NOT_NEEDED" not in codes(fixed, f)
    # without offload too, across these nodes: ZeRO-3's gathers cross the 100 Gbit/s link in every pass; ZeRO-2,
    # which keeps the fast path at 0.98x DDP, is not worth a warning with bf16 matmuls on both sides; with FP8's
    # auto, which runs this checkpointed 7B LoRA in FP8 without DeepSpeed only (1.17x), it is, and says why
    lora3 = [a for a in advise(preset(zero_stage=3), f) if a.code == "ZERO_NOT_NEEDED"]
    assert lora3 and "ZeRO-3 gathers every layer's weights in each pass" in lora3[0].message
    assert "ZERO_NOT_NEEDED" not in codes(preset(zero_stage=2, fp8="off"), f)
    (z2,) = [a for a in advise(preset(zero_stage=2), f) if a.code == "ZERO_NOT_NEEDED"]
    assert "without DeepSpeed FP8's auto runs the matmuls in FP8 (1.17x measured" in z2.message
    # full fine-tuning of 7B needs ZeRO's partitioning on 80 GiB: no advice to drop it
    assert "ZERO_NOT_NEEDED" not in codes(preset(method="full", zero_stage=3), f)
    # nor where DDP would fit only just (above 90% of the GPU), nor without a known GPU, nor on CPU
    from qwen_tui.advice.rules import make_context

    ddp_total = make_context(apply_fix(p, adv[0].fix), f).memory().total
    assert "ZERO_NOT_NEEDED" not in codes(p, f, gpu_memory_gib=ddp_total / 0.95)
    assert "ZERO_NOT_NEEDED" in codes(p, f, gpu_memory_gib=ddp_total / 0.8)
    assert "ZERO_NOT_NEEDED" not in codes(p)
    assert "ZERO_NOT_NEEDED" not in codes(preset(device="cpu"), gpu="H100")


# ---------------------------------------------------------------- network

def test_zero3_slow_link_says_what_zero2_gives():
    p = preset(method="full", zero_stage=3, nodes=4, gpus=8, model="Qwen/Qwen2.5-1.5B-Instruct")
    adv = [a for a in advise(p, gpu="H100", bandwidth_gbps=10) if a.code == "ZERO3_SLOW_LINK"]
    assert adv and "ZeRO-2 would take" in adv[0].message and "10 Gbit/s" in adv[0].message
    assert adv[0].fix.changes["training.zero_stage"] == 2
    assert "ZERO3_SLOW_LINK" not in codes(p, gpu="H100", bandwidth_gbps=3200)
    assert "ZERO3_SLOW_LINK" not in codes(preset(method="full", zero_stage=2, nodes=4), gpu="H100", bandwidth_gbps=10)
    assert "ZERO3_SLOW_LINK" not in codes(preset(method="full", zero_stage=3, nodes=1), gpu="H100", bandwidth_gbps=10)


def test_low_bandwidth():
    f = facts(links={1: LinkFacts(bandwidth_gbps=4.6)})
    adv = [a for a in advise(preset(), f) if a.code == "LOW_BANDWIDTH"]
    assert adv and adv[0].node == 1 and "4.6 Gbit/s" in adv[0].message
    f_ib = ClusterFacts(nodes={0: gpu_node(0), 1: gpu_node(1, ib_devices=["mlx5_0"])},
                        links={1: LinkFacts(bandwidth_gbps=2.0)})
    adv = [a for a in advise(preset(network={"nccl_ib_disable": True}), f_ib) if a.code == "LOW_BANDWIDTH"]
    assert adv[0].fix.changes == {"network.nccl_ib_disable": False}
    assert "LOW_BANDWIDTH" not in codes(preset(), facts(links={1: LinkFacts(bandwidth_gbps=25)}))


def test_port_unreachable_and_in_use():
    f = facts(links={1: LinkFacts(port_reachable=False, port_error="timed out")}, master_port_free=False)
    adv = {a.code: a for a in advise(preset(), f)}
    assert adv["PORT_UNREACHABLE"].level == "error" and "timed out" in adv["PORT_UNREACHABLE"].message
    assert adv["PORT_UNREACHABLE"].fix.hint
    assert apply_fix(preset(), adv["PORT_IN_USE"].fix).network.master_port == 29501
    ok = facts(links={1: LinkFacts(port_reachable=True)}, master_port_free=True)
    assert not {"PORT_UNREACHABLE", "PORT_IN_USE"} & set(codes(preset(), ok))


def test_timeouts():
    p = preset(network={"rdzv_timeout": 1800, "nccl_timeout": 36000, "env": {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}})
    adv = {a.code: a for a in advise(p)}
    assert {"RDZV_TIMEOUT_LONG", "NCCL_TIMEOUT_LONG", "TIMEOUT_NONE"} <= set(adv)
    fixed = apply_fix(p, adv["TIMEOUT_NONE"].fix)
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in fixed.network.env
    assert apply_fix(p, adv["RDZV_TIMEOUT_LONG"].fix).network.rdzv_timeout == 120
    assert not {"RDZV_TIMEOUT_LONG", "NCCL_TIMEOUT_LONG", "TIMEOUT_NONE"} & set(codes(preset()))


# ---------------------------------------------------------------- cluster consistency

def test_gpu_mismatch_models_and_counts():
    f = ClusterFacts(nodes={0: gpu_node(0), 1: gpu_node(1, "NVIDIA A100-SXM4-80GB", mib=81920)})
    assert "GPU_MISMATCH" in codes(preset(), f)
    p = Preset.model_validate({**preset().model_dump(), "cluster": {"nodes": [{"host": "a", "gpus": 8},
                                                                             {"host": "b", "gpus": 4}]}})
    adv = [a for a in advise(p) if a.code == "GPU_MISMATCH"]
    assert adv and apply_fix(p, adv[0].fix).cluster.nodes[0].gpus == 4
    assert "GPU_MISMATCH" not in codes(preset(), facts())


def test_gpu_count_more_processes_than_gpus():
    f = ClusterFacts(nodes={0: gpu_node(0), 1: gpu_node(1, n=4)})
    adv = [a for a in advise(preset(), f) if a.code == "GPU_COUNT"]
    assert adv and adv[0].node == 1 and apply_fix(preset(), adv[0].fix).cluster.nodes[1].gpus == 4
    assert "GPU_COUNT" not in codes(preset(), facts())


def test_version_mismatch_and_missing_package():
    f = facts()
    f.nodes[0].versions = {"torch": "2.5.1", "transformers": "4.51.0", "peft": "0.14.0", "deepspeed": "0.16.0"}
    f.nodes[1].versions = {"torch": "2.6.0", "transformers": "4.51.3", "peft": None, "deepspeed": "0.16.0"}
    adv = advise(preset(), f)
    vm = {a.message.split()[0]: a for a in adv if a.code == "VERSION_MISMATCH"}
    assert vm["torch"].level == "error" and "2.6.0" in vm["torch"].message
    assert vm["transformers"].level == "warning"
    assert [a.node for a in adv if a.code == "PACKAGE_MISSING"] == [1]
    same = facts()
    for nf in same.nodes.values():
        nf.versions = dict(f.nodes[0].versions)
    assert not {"VERSION_MISMATCH", "PACKAGE_MISSING"} & set(codes(preset(), same))


def test_fast_kernel_missing_names_the_nodes_and_is_a_warning_only_when_nodes_differ():
    p = preset(zero_stage=None)
    f = facts(nodes=3)
    f.nodes[2].gpus = [GPU(j, "NVIDIA A100-SXM4-80GB", 81920) for j in range(8)]  # not Hopper: cuDNN's is not for it
    for nf in f.nodes.values():
        nf.versions = {"torch": "2.11.0", "liger-kernel": "0.8.5", "nvidia-cudnn-frontend": None}
    f.nodes[1].versions["liger-kernel"] = None
    adv = {a.message.split()[0]: a for a in advise(p, f) if a.code == "FAST_KERNEL_MISSING"}
    assert adv["liger-kernel"].level == "warning" and adv["liger-kernel"].node == 1
    assert "node(s) 1:" in adv["liger-kernel"].message and "slowest rank" in adv["liger-kernel"].message
    # no Hopper node has the frontend: the same kernels everywhere, so only information; the A100 is not named
    cudnn = adv["nvidia-cudnn-frontend"]
    assert cudnn.level == "info" and "node(s) 0, 1:" in cudnn.message and "pip install nvidia-cudnn-frontend" in cudnn.fix.hint
    # ZeRO-2 keeps packed rows and the fused loss, so both count; ZeRO-3 runs the plain path and uses neither
    assert [a.message.split()[0] for a in advise(preset(zero_stage=2), f)
            if a.code == "FAST_KERNEL_MISSING"] == ["liger-kernel", "nvidia-cudnn-frontend"]
    assert "FAST_KERNEL_MISSING" in codes(preset(zero_stage=3), f)  # ZeRO-3 runs the fast path too
    for nf in f.nodes.values():
        nf.versions.update({"liger-kernel": "0.8.5", "nvidia-cudnn-frontend": "1.32.0"})
    assert "FAST_KERNEL_MISSING" not in codes(p, f)


def test_data_and_model_missing_or_different():
    f = facts()
    f.nodes[0].data = FileFact("/data/chat.jsonl", True, 100, "aa")
    f.nodes[1].data = FileFact("/data/chat.jsonl", False)
    f.nodes[0].model = FileFact("/m/qwen", True, 5, "x")
    f.nodes[1].model = FileFact("/m/qwen", False)
    p = preset(model="/m/qwen")
    assert {"DATA_MISSING", "MODEL_MISSING"} <= set(codes(p, f))
    f.nodes[1].data = FileFact("/data/chat.jsonl", True, 120, "bb")
    f.nodes[1].model = FileFact("/m/qwen", True, 6, "y")
    c = codes(p, f)
    assert {"DATA_DIFFERS", "MODEL_DIFFERS"} <= set(c) and "DATA_MISSING" not in c
    f.nodes[1].data = FileFact("/data/chat.jsonl", True, 100, "aa")
    f.nodes[1].model = FileFact("/m/qwen", True, 5, "x")
    assert not {"DATA_DIFFERS", "MODEL_DIFFERS", "DATA_MISSING", "MODEL_MISSING"} & set(codes(p, f))
    # builtin data is never looked for
    f.nodes[1].data = FileFact("builtin:demo-chat", False)
    assert "DATA_MISSING" not in codes(preset(data="builtin:demo-chat"), f)


def test_duplicate_host():
    f = facts()
    f.nodes[1].hostname = "gpu0"
    adv = [a for a in advise(preset(), f) if a.code == "DUPLICATE_HOST"]
    assert adv and adv[0].level == "error"
    assert len(apply_fix(preset(), adv[0].fix).cluster.nodes) == 1
    p = Preset.model_validate({**preset().model_dump(), "cluster": {"nodes": [{"host": "a", "port": 22},
                                                                             {"host": "a", "port": 2222}]}})
    assert "DUPLICATE_HOST" in codes(p)
    assert "DUPLICATE_HOST" not in codes(preset(), facts())


def test_no_shared_storage():
    assert "NO_SHARED_STORAGE" in codes(preset(), facts(shared_storage=False))
    adv = [a for a in advise(preset(), facts(shared_storage=False)) if a.code == "NO_SHARED_STORAGE"][0]
    assert apply_fix(preset(), adv.fix).cluster.shared_storage is False
    assert "NO_SHARED_STORAGE" not in codes(preset(), facts(shared_storage=True))
    assert "NO_SHARED_STORAGE" not in codes(preset(save_strategy="no"), facts(shared_storage=False))
    assert "NO_SHARED_STORAGE" not in codes(preset(cluster={"shared_storage": False}), facts(shared_storage=False))


def test_shared_storage_undeclared():
    undeclared = preset(cluster={"shared_storage": False})
    adv = [a for a in advise(undeclared, facts(shared_storage=True)) if a.code == "SHARED_STORAGE_UNDECLARED"]
    assert adv and adv[0].level == "error"
    assert apply_fix(undeclared, adv[0].fix).cluster.shared_storage is True
    assert "SHARED_STORAGE_UNDECLARED" not in codes(undeclared, facts(shared_storage=False))
    assert "SHARED_STORAGE_UNDECLARED" not in codes(undeclared, facts(shared_storage=None))
    assert "SHARED_STORAGE_UNDECLARED" not in codes(preset(), facts(shared_storage=True))
    # no checkpoints, but every node still saves the final model into the one output_dir at the end
    no_ckpt = preset(cluster={"shared_storage": False}, save_strategy="no")
    assert "SHARED_STORAGE_UNDECLARED" in codes(no_ckpt, facts(shared_storage=True))


# ---------------------------------------------------------------- method and model

def test_qlora_rules():
    # ZeRO-3 shards a base quantized on load; a GPTQ checkpoint's packed weights it cannot
    assert "QLORA_ZERO3" not in codes(preset(method="qlora", zero_stage=3))
    gptq = preset(method="qlora", zero_stage=3, model="Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4")
    adv = {a.code: a for a in advise(gptq)}
    assert "GPTQ checkpoint" in adv["QLORA_ZERO3"].message
    assert apply_fix(gptq, adv["QLORA_ZERO3"].fix).training.zero_stage == 2
    assert "QLORA_ZERO3" not in codes(preset(method="qlora", zero_stage=2))
    p = preset(method="full", extra_args=["--q_lora"])
    fixed = apply_fix(p, [a for a in advise(p) if a.code == "QLORA_FULL"][0].fix)
    assert fixed.training.method == "qlora" and fixed.training.extra_args == []
    assert "QLORA_FULL" not in codes(preset(method="full"))


def test_qlora_unquantizable(tmp_path):
    import json

    cfg = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
           "quantization_config": {"quant_method": "fp8"}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert "QLORA_UNQUANTIZABLE" in codes(preset(method="qlora", model=str(tmp_path)))
    assert "QLORA_UNQUANTIZABLE" in codes(preset(method="qlora", model="Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4",
                                                 device="cpu"))
    assert "QLORA_UNQUANTIZABLE" not in codes(preset(method="qlora"))
    assert "QLORA_UNQUANTIZABLE" not in codes(preset(method="qlora", model="Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4"))


def test_int4_needs_qlora():
    p = preset(method="lora", zero_stage=3, model="Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4")
    adv = [a for a in advise(p) if a.code == "INT4_NEEDS_QLORA"]
    assert adv and adv[0].level == "error"
    fixed = apply_fix(p, adv[0].fix)
    assert fixed.training.method == "qlora" and fixed.training.zero_stage == 2
    assert "INT4_NEEDS_QLORA" not in codes(fixed)
    assert "INT4_NEEDS_QLORA" not in codes(preset(method="lora"))


def test_lora_batch_range():
    low = preset(nodes=1, gpus=2, per_device_train_batch_size=1, gradient_accumulation_steps=2)  # 4
    adv = [a for a in advise(low) if a.code == "LORA_BATCH_RANGE"][0]
    assert "effective batch 4 " in adv.message
    assert 8 <= apply_fix(low, adv.fix).effective_batch_size <= 256
    high = preset(per_device_train_batch_size=32, gradient_accumulation_steps=4)  # 2048
    adv = [a for a in advise(high) if a.code == "LORA_BATCH_RANGE"][0]
    assert 8 <= apply_fix(high, adv.fix).effective_batch_size <= 256
    assert "LORA_BATCH_RANGE" not in codes(preset(nodes=1, gpus=1))  # a new preset's 1 x 8 on one GPU
    assert "LORA_BATCH_RANGE" not in codes(preset(nodes=2, gpus=1, per_device_train_batch_size=8,
                                                  gradient_accumulation_steps=1))  # the demo's 16
    assert "LORA_BATCH_RANGE" not in codes(preset())  # 128
    assert "LORA_BATCH_RANGE" not in codes(preset(method="full", gradient_accumulation_steps=1))


def test_unknown_model_is_info_not_a_crash():
    p = preset(model="mistralai/Mistral-7B")
    adv = advise(p, gpu="H100", bandwidth_gbps=1)
    assert [a.level for a in adv if a.code == "MODEL_UNKNOWN"] == ["info"]
    assert "OOM" not in [a.code for a in adv]


# ---------------------------------------------------------------- fixes

def test_apply_fix_returns_a_new_validated_preset():
    p = preset()
    q = apply_fix(p, Fix("Use ZeRO-3", {"training.zero_stage": 3}))
    assert q.training.zero_stage == 3 and p.training.zero_stage == 2 and q is not p
    with pytest.raises(ValueError):
        apply_fix(p, Fix("bad", {"training.zero_stage": 4}))
    with pytest.raises(KeyError):
        apply_fix(p, Fix("bad", {"training.no_such_field": 1}))


def test_advice_is_sorted_and_serialisable():
    p = preset(method="qlora", zero_stage=3, per_device_train_batch_size=1, gradient_accumulation_steps=1,
               network={"rdzv_timeout": 3600})
    adv = advise(p)
    levels = [a.level for a in adv]
    assert levels == sorted(levels, key=["error", "warning", "info"].index)
    for a in adv:
        d = a.to_dict()
        assert set(d) >= {"code", "level", "message", "fix"} and d["code"].isupper()
        assert isinstance(a, Advice)


def test_apply_fix_keeps_unset_fields_unset_so_local_nodes_keep_our_python(tmp_path):
    """Issue 18, bug 2: a fix must not mark `python` as set (the plan would then run `python3` on a
    local node instead of qwen-tui's own interpreter), nor any other field the preset left out."""
    from pathlib import Path

    from qwen_tui.plan.launch import make_plan
    from qwen_tui.preset.files import load_preset

    demo = load_preset(Path(__file__).resolve().parents[2] / "presets" / "local-demo.yaml")
    fixed = apply_fix(demo, Fix("Lower the learning rate", {"training.learning_rate": 1e-3}))
    assert fixed.training.learning_rate == 1e-3
    assert all("python" not in n.model_fields_set for n in fixed.cluster.nodes)
    plan = make_plan(fixed, run_id="r1", local_run_dir=str(tmp_path / "r1"), local_python="/opt/venv/bin/python")
    assert [c.argv[0] for c in plan.nodes] == ["/opt/venv/bin/python"] * 2
    # a field of a section the preset never gave is set, and only it
    q = apply_fix(Preset.model_validate({"cluster": {"nodes": [{"host": "localhost"}]},
                                         "training": {"model": "builtin:tiny", "data": "builtin:demo-chat"}}),
                  Fix("Longer timeout", {"network.rdzv_timeout": 120}))
    assert q.network.rdzv_timeout == 120 and q.network.model_fields_set == {"rdzv_timeout"}
    assert "python" not in q.cluster.nodes[0].model_fields_set
    with pytest.raises(KeyError):
        apply_fix(demo, Fix("bad", {"network.no_such_field": 1}))


def test_remove_node_fix_keeps_the_other_nodes_unset_fields():
    f = facts()
    f.nodes[1].hostname = "gpu0"
    adv = [a for a in advise(preset(), f) if a.code == "DUPLICATE_HOST"]
    kept = apply_fix(preset(), adv[0].fix).cluster.nodes[0]
    assert "python" not in kept.model_fields_set and kept.python == "python3"


def test_dpo_traps_and_its_step_cost():
    """A DPO preset at SFT's learning rate, an odd beta, on a base model: each trap said with its fix; and the
    estimate counts both answers of a pair (twice the tokens and activations of an SFT step)."""
    from qwen_tui.advice.rules import advise
    from qwen_tui.model.spec import resolve_model
    from qwen_tui.plan.estimate import RunShape, estimate_memory
    from qwen_tui.preset.files import load_preset
    from support.paths import ROOT

    base = load_preset(ROOT / "presets" / "qwen2.5-7b-lora-2node-zero2.yaml")
    dpo = base.with_changes({"training.stage": "dpo", "training.model": "Qwen/Qwen2.5-7B",
                             "training.pref_beta": 0.001, "training.learning_rate": 2e-4})
    got = {a.code: a for a in advise(dpo)}
    assert {"DPO_BETA", "DPO_LEARNING_RATE", "DPO_REFERENCE", "DPO_COST"} <= set(got)
    assert got["DPO_LEARNING_RATE"].fix.changes == {"training.learning_rate": 2e-5}
    assert got["DPO_BETA"].fix.changes == {"training.pref_beta": 0.1}
    fixed = dpo.with_changes({"training.model": "Qwen/Qwen2.5-7B-Instruct", "training.pref_beta": 0.1,
                              "training.learning_rate": 2e-5})
    assert {a.code for a in advise(fixed)} & {"DPO_BETA", "DPO_LEARNING_RATE", "DPO_REFERENCE"} == set()
    assert not {a.code for a in advise(base)} & {"DPO_BETA", "DPO_LEARNING_RATE", "DPO_REFERENCE", "DPO_COST"}
    spec = resolve_model("Qwen/Qwen2.5-7B-Instruct")
    sft_run, dpo_run = RunShape.of(base.training), RunShape.of(fixed.training)
    assert dpo_run.tokens == 2 * sft_run.tokens
    assert estimate_memory(spec, fixed.training, 16).activations > estimate_memory(spec, base.training, 16).activations
