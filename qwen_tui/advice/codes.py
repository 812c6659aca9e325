"""Every advice code, what raises it and what fixes it: the reference of the manual is generated from this table
(docs/gen_reference.py), and tests/unit/test_reference.py fails when a rule raises a code that has no entry here,
or an entry no rule raises. A new rule's code gets its line here, in the order of the rules."""

from __future__ import annotations

from ..base.levels import CodeDoc

ADVICE: dict[str, CodeDoc] = {
    "MODEL_UNKNOWN": CodeDoc(
        "info",
        "the model's shape is unknown (no config.json here, not a known Qwen2/2.5/3 release dense or "
        "mixture-of-experts, or another architecture): no estimate"),
    "MOE_QLORA": CodeDoc(
        "error",
        "Q-LoRA of a mixture-of-experts model: transformers stores its experts fused as 3-D tensors, which "
        "bitsandbytes cannot quantize (nn.Linear only), so nearly all weights would stay in 16 bits; the worker "
        "refuses it",
        "`training.method: lora`, `training.zero_stage: 3`"),
    "MOE_LORA_EXPERTS": CodeDoc(
        "warning",
        "LoRA on `gate_proj`/`up_proj`/`down_proj` of a mixture of experts adapts every expert of every layer; says "
        "the trainable parameters, the multiple of the attention's and their fp32 states (a token trains k of E); with "
        "`lora_dropout` > 0 it says the dropout goes on the attention's adapters only (peft's LoRA on fused experts "
        "has none; the worker logs it)",
        "`training.lora_target_modules: [q_proj, k_proj, v_proj, o_proj]`"),
    "MOE_ZERO3": CodeDoc(
        "info",
        "ZeRO-3 on a mixture of experts: the worker makes every MoE layer one leaf module (all experts gathered at "
        "once, so ranks routing to different experts never wait on each other), and each micro-batch still brings all "
        "parameters to every GPU though a token uses the active ones; says both and the size of a layer"),
    "MOE_ROUTING": CodeDoc(
        "info",
        "a mixture of experts has no capacity limit (no token dropped; imbalance costs speed); the load-balancing loss"
        " (config coefficient or `--router_aux_loss_coef`) is added on every path and logged as `aux_loss`; the "
        "routers stay frozen unless `--train_router`; step times count active parameters at the dense path's "
        "efficiency"),
    "DPO_BETA": CodeDoc(
        "warning",
        "`training.stage: dpo` with `pref_beta` outside 0.01-0.5: too small lets the policy drift far from the "
        "reference, too large barely moves it",
        "`training.pref_beta: 0.1`"),
    "DPO_LEARNING_RATE": CodeDoc(
        "warning",
        "DPO at an SFT learning rate (above 1e-5 full, 1e-4 LoRA): DPO's is usually an order below",
        "`training.learning_rate` 1e-6 (full) or 2e-5 (LoRA)"),
    "DPO_REFERENCE": CodeDoc(
        "warning",
        "DPO starting from a model that does not look like an SFT model (a base release, `builtin:`): the "
        "reference is the model DPO starts from",
        "hint: the Run view's `m` (or `qwen-tui merge`) writes `OUTPUT_DIR/merged`; start from it"),
    "DPO_COST": CodeDoc(
        "info",
        "what a DPO step costs: both answers of every pair through the policy (twice an SFT step's tokens and "
        "activations at the same micro-batch, which the estimate counts), the reference's forward once before the "
        "first step, no second model"),
    "FP8_CANNOT_RUN": CodeDoc(
        "error",
        "`training.fp8: on` where the worker refuses it at set-up: Q-LoRA, a precision other than bf16, CPU "
        "processes, a GPU type without FP8 tensor cores (compute capability under 8.9), or a node whose probe found "
        "no torchao",
        "`training.fp8: auto`, `training.precision: bf16`, or hint: `pip install torchao` on the node"),
    "FP8_UNMEASURED": CodeDoc(
        "warning",
        "`training.fp8: on` for a mixture of experts, where FP8 was not measured (its experts are not linear layers "
        "torchao converts): the estimate counts no change, and it may run slower, as most shapes measured through "
        "the worker did",
        "`training.fp8: auto`"),
    "FP8_TORCHAO": CodeDoc(
        "info / warning",
        "`training.fp8: auto` would run FP8 here but a node's probe found no torchao: every node stays bf16; a "
        "warning when the other nodes have it. Silent where auto would keep bf16 anyway (it runs FP8 only for a "
        "7B-class LoRA base without DeepSpeed in rows of 8,192+ tokens, measured 1.10-1.12x: "
        "bench/results/fp8_worker-2026-12-05-H100-rows.md; 1.17x with gradient checkpointing: fp8_worker-2026-12-06-H100-ckpt.md)",
        "hint: `pip install torchao` (or qwen-tui's `[gpu]` extra) on the node"),
    "FP8_ON": CodeDoc(
        "warning / info",
        "FP8 matmuls run on this preset (`training.fp8: on` on GPUs with FP8 tensor cores, or auto where it was "
        "measured faster): what converts and what stays bf16, the FP8/bf16 ratio measured through the worker "
        "nearest the run's shape that the estimate counts (1.10x for a 7B LoRA base in rows of 8,192, 0.94x in rows "
        "of 4,096, 0.80-0.98x for 1.5B full; a gain within noise, or measured only at a larger size or in longer "
        "rows, counts as none: bench/results/fp8_worker-2026-12-05-H100*.md; a warning where it measured slower), "
        "and how the run proves FP8 engaged (converted layers, FP8 matmuls of step 2, the loss checked against bf16 "
        "over the first 8 steps)",
        "`training.fp8: auto`"),
    "OFFLOAD_HOST_MEMORY": CodeDoc(
        "error / warning / info",
        "ZeRO offload keeps the optimizer's fp32 states on the nodes' hosts (DeepSpeed's estimators: 16 bytes a "
        "trainable parameter, 18 with the parameters offloaded too, shared by the nodes, x1.5 for its buffers, plus "
        "each rank's process): an error when that is more than the smallest node's RAM as the probe read it, a "
        "warning past 85% of it, the figure alone where the RAM was not probed; the OOM fix offers offload only "
        "where the hosts hold it",
        "`training.offload: none` where the GPUs hold the run; else more nodes, or LoRA"),
    "OOM": CodeDoc(
        "error",
        "estimated memory per GPU > the smallest GPU's memory; says the largest micro-batch that fits",
        "largest micro-batch that fits (accumulation raised to keep the effective batch), else the first of: "
        "checkpointing on, ZeRO-3, CPU optimizer offload, LoRA, Q-LoRA that fits"),
    "MEMORY_TIGHT": CodeDoc(
        "warning",
        "fits, but above 90% of the GPU: little room for longer batches or fragmentation",
        "hint: a smaller micro-batch or `model_max_length`, gradient checkpointing, or ZeRO-3"),
    "CKPT_UNNEEDED": CodeDoc(
        "info",
        "gradient checkpointing is on, yet without it the estimate stays under 85% of the GPU (speed left on the "
        "table)",
        "`training.gradient_checkpointing: false`"),
    "ZERO_NOT_NEEDED": CodeDoc(
        "warning",
        "ZeRO-2/3 is on, yet the model fits each GPU without it (under 90%), and plain DDP is predicted >= 1.2x faster"
        " per step, network included (ZeRO-3 gathers every layer's weights in each pass, CPU offload steps the "
        "optimizer on the host; ZeRO-2 alone measured 0.95x DDP and rarely qualifies); says both speeds",
        "`training.zero_stage: null` (and `training.offload: none`)"),
    "ZERO3_SLOW_LINK": CodeDoc(
        "warning",
        "ZeRO-3 over several nodes is predicted >= 1.2x slower per step than ZeRO-2 at the bandwidth between nodes "
        "(its source named); says ZeRO-2's step time and whether it fits",
        "`training.zero_stage: 2` (with optimizer offload if only that fits)"),
    "NODES_PAST_WORTH": CodeDoc(
        "warning",
        "more nodes than pay for themselves: past the count it names, each further node's GPUs add less than half of "
        "what each GPU does alone, at the bandwidth between nodes (its source named); only a count whose own "
        "estimate fits (GPU memory, and with offload the hosts' RAM) is named, and none when no smaller count fits",
        "hint: that many nodes, or a faster link (more NICs for NCCL, InfiniBand/RoCE)"),
    "LOW_BANDWIDTH": CodeDoc(
        "warning",
        "a node's link to the master measured under 10 Gbit/s; says the bytes per step and their time",
        "`network.nccl_ib_disable: false` if the node has InfiniBand that is disabled, else a hint"),
    "PORT_UNREACHABLE": CodeDoc(
        "error",
        "a node cannot connect to the master port",
        "hint: open the port"),
    "PORT_IN_USE": CodeDoc(
        "error",
        "the master port is taken on node 0",
        "`network.master_port: +1`"),
    "RDZV_TIMEOUT_LONG": CodeDoc(
        "warning",
        "rendezvous timeout > 600 s",
        "`network.rdzv_timeout: 120`"),
    "NCCL_TIMEOUT_LONG": CodeDoc(
        "warning",
        "NCCL timeout > 3 h",
        "`network.nccl_timeout: 1800`"),
    "TIMEOUT_NONE": CodeDoc(
        "warning",
        "`network.env` turns NCCL's async error handling off (a hang never ends)",
        "remove that variable"),
    "GPU_MISMATCH": CodeDoc(
        "warning",
        "different GPU models across nodes, or different GPU counts per node",
        "same count on every node (the smallest)"),
    "GPU_COUNT": CodeDoc(
        "error",
        "a machine has fewer GPUs than the processes the preset starts there",
        "the probed count"),
    "DUPLICATE_HOST": CodeDoc(
        "error / warning",
        "two nodes are the same machine by probed hostname (error), or the same host with different ports (warning)",
        "remove the duplicate node"),
    "VERSION_MISMATCH": CodeDoc(
        "error / warning",
        "a package (torch, transformers, deepspeed, peft, accelerate, bitsandbytes, tokenizers) or Python differs "
        "across nodes; error for torch/deepspeed major.minor",
        "hint: install node 0's version"),
    "PACKAGE_MISSING": CodeDoc(
        "error",
        "a package the run needs is not installed on a node",
        "hint: install it"),
    "FAST_KERNEL_MISSING": CodeDoc(
        "warning / info",
        "without DeepSpeed or under ZeRO-1/2 (where the worker packs rows and runs its fused loss), a GPU node lacks "
        "`liger-kernel` (fused loss) or, on Hopper or newer, `nvidia-cudnn-frontend` (cuDNN attention); a warning when"
        " other nodes have it (the ranks then run different kernels and wait for the slowest), else info",
        "hint: install it (or qwen-tui's `[gpu]` extra)"),
    "DATA_MISSING": CodeDoc(
        "error",
        "the data file is absent on a node (built-ins and hub ids without local copies are not checked)",
        "hint: copy it"),
    "MODEL_MISSING": CodeDoc(
        "error",
        "the model directory is absent on a node (built-ins and hub ids without local copies are not checked)",
        "hint: copy it"),
    "DATA_DIFFERS": CodeDoc(
        "error",
        "the file differs between nodes (sha256, else size)",
        "hint: copy node 0's"),
    "MODEL_DIFFERS": CodeDoc(
        "warning",
        "the file differs between nodes (sha256, else size)",
        "hint: copy node 0's"),
    "LONG_RECORD_OOM": CodeDoc(
        "error",
        "rows are long (a GPU's share of `model_max_length` is 16k tokens or more) and one record of "
        "`model_max_length` does not fit a GPU on the worker's long-row path (checkpointed layers, fused loss, the MLP"
        " tiled from 32k tokens a GPU, `sequence_parallel_size` GPUs a row); says the memory and the longest record "
        "that fits. The stock memory rules (`OOM`, `MEMORY_TIGHT`, `CKPT_UNNEEDED`, `ZERO_NOT_NEEDED`) step aside for "
        "long rows",
        "the smallest `training.sequence_parallel_size` that fits, else `training.model_max_length`: the longest that "
        "fits"),
    "LONG_CONTEXT": CodeDoc(
        "info",
        "long rows that fit: the longest record a GPU trains and what `model_max_length` needs"),
    "SP_SHAPE": CodeDoc(
        "error",
        "`sequence_parallel_size` does not suit the model's heads (a local checkpoint's: known models are checked when"
        " the preset loads): the query heads must divide among the group, and the key/value heads divide among it or "
        "it among them",
        "the largest size below that fits"),
    "SP_NEEDS_PACKING": CodeDoc(
        "error",
        "sequence parallelism with `--no_packing` in `extra_args` (it shards packed rows)",
        "drop `--no_packing`"),
    "DATA_TOO_LONG_FOR_GPU": CodeDoc(
        "error",
        "`qwen-tui data`: records (as cut to `model_max_length`) longer than the longest a GPU trains: their rows "
        "would run out of memory",
        "`training.model_max_length`: that length (cuts them); or more GPUs a row (`sequence_parallel_size`)"),
    "QLORA_FULL": CodeDoc(
        "error",
        "`extra_args` ask for 4-bit loading (`--q_lora`, `--load_in_4bit`, ...) with method full",
        "`training.method: qlora`"),
    "QLORA_ZERO3": CodeDoc(
        "error",
        "Q-LoRA with ZeRO-3 on a GPTQ/AWQ checkpoint (its packed weights cannot be partitioned; a plain checkpoint, "
        "quantized to nf4 on load, is sharded)",
        "`training.zero_stage: 2`"),
    "QLORA_UNQUANTIZABLE": CodeDoc(
        "error",
        "Q-LoRA on a checkpoint stored in a format it cannot train (fp8, gguf, ...), or a GPTQ/AWQ one on CPU",
        "`training.method: lora` or a hint"),
    "QLORA_MERGE": CodeDoc(
        "error",
        "`merge_lora` with a GPTQ/AWQ base",
        "`training.merge_lora: false`"),
    "INT4_NEEDS_QLORA": CodeDoc(
        "error",
        "a quantized (`-Int4`, `-AWQ`, quantization_config) model with method full or lora",
        "`training.method: qlora` (and ZeRO-2)"),
    "LORA_BATCH_RANGE": CodeDoc(
        "warning",
        "LoRA/Q-LoRA effective batch outside 8..256",
        "accumulation (or micro-batch) that brings it into range"),
    "P2P_PCIE": CodeDoc(
        "warning",
        "a node runs 2+ ranks on GeForce/TITAN/RTX cards (RTX 4090, 5090, A6000, PRO 6000, ...) that `nvidia-smi topo "
        "-m` shows joined over PCIe only: NCCL's peer-to-peer hangs the first collective there until it is turned off "
        "(DeepSpeed#4433, LLaMA-Factory#7300, nccl-tests#117), even where `topo -p2p` says OK; one per node, not given"
        " when `network.env` already sets `NCCL_P2P_DISABLE` or `NCCL_P2P_LEVEL`",
        "`network.env` + `NCCL_P2P_LEVEL: NVL`: P2P over NVLink only. `network.env` reaches every node, so NVL rather "
        "than `NCCL_P2P_DISABLE=1`: bridged pairs and NVSwitch nodes keep NVLink, PCIe pairs go through host memory"),
    "P2P_UNSUPPORTED": CodeDoc(
        "info",
        "other GPUs on PCIe whose driver reports no peer-to-peer (`topo -p2p r`/`w`: CNS, GNS, TNS, NS, DR): NCCL goes"
        " through host memory there, slower, no hang"),
    "SHARED_STORAGE_UNDECLARED": CodeDoc(
        "error",
        "the check found `output_dir` to be one filesystem on every node, but the preset says it is not, so every node"
        " would write the same checkpoint files",
        "`cluster.shared_storage: true`"),
    "NO_SHARED_STORAGE": CodeDoc(
        "warning",
        "the preset says shared storage but the check found none, so checkpoints would be saved on rank 0 only",
        "`cluster.shared_storage: false` (the plan then saves on every node)"),
    "DATA_TOO_SMALL": CodeDoc(
        "error",
        "`qwen-tui data`: fewer usable records than one global batch: the worker would stop before training",
        "the smallest micro-batch and accumulation (`training.per_device_train_batch_size: 1`, "
        "`training.gradient_accumulation_steps: 1`)"),
    "DATA_TRUNCATED": CodeDoc(
        "warning",
        "`qwen-tui data`: more than 1% of the records are longer than `model_max_length` and get cut; says the p99 "
        "length",
        "`training.model_max_length`: the p99"),
    "DATA_DROPPED": CodeDoc(
        "warning",
        "`qwen-tui data`: records with no assistant token left after the cut, which the worker skips",
        "`training.model_max_length`: the longest record"),
    "DATA_PADDING": CodeDoc(
        "warning",
        "`qwen-tui data`: more than 20% of the tokens a step computes would be padding",
        "hint: with packing, fewer and fuller rows (more accumulation or a smaller micro-batch); without it, drop "
        "`--no_packing` from `training.extra_args`"),
}
