"""Memory per GPU, from a model's shape alone (pure; no torch); step time and scaling are estimate_time.py.

Memory (`estimate_memory`)
==========================
Peak memory of one rank is the resident model states plus the largest of three
moments of a training step, each a sum of tensors that are alive together:

- loss backward (start of backward): every activation autograd saved, the
  logits and loss tensors, and (mixed precision with fp32 weights) the bf16 copies
  of the weights that autocast made and the matmuls saved;
- layer recompute (gradient checkpointing only): the per-layer checkpoints, one
  decoder layer's activations recomputed, and the gradients accumulated so far;
- end of backward / optimizer step: all gradients, plus the embedding's gradient
  while it is added into the tied lm_head gradient.

Model states, in bytes per parameter (P all, Pt trainable, N = world size):

- no ZeRO: weights in their dtype, gradients of the trainable ones (and DDP's
  bucket copy of them when N > 1), AdamW m and v in the trainable dtype (fused
  torch AdamW: 8 bytes fp32 or 4 bytes bf16 per parameter);
- ZeRO-2 (DeepSpeed `estimate_zero2_model_states_mem_needs`): 2P bf16 weights +
  18P/N (2 bf16 grads, 4 fp32 grads, 4 fp32 master, 8 Adam), offload: 2P. The
  bucket buffers it leaves out are counted in the overhead;
- ZeRO-3 (`estimate_zero3_model_states_mem_needs`): 4 x largest layer + 18P/N
  (2 bf16 weight shard, 4 gradients, 12 fp32 master and Adam);
  optimizer offload: 4 x largest + 2P/N; all offloaded: 4 x largest.
  For LoRA the 18 bytes apply to Pt; frozen weights stay 2 bytes (ZeRO-3: 2/N).
- Q-LoRA: projections in 4 bits (0.52 bytes/param: nf4 + double-quantized
  absmax; GPTQ-Int4 with group 128 is the same within 1%), and
  `prepare_model_for_kbit_training` casts the rest (embeddings, lm_head, norms)
  to fp32.

Activations, bytes per token per decoder layer (h hidden, q = heads x head_dim,
k = kv_heads x head_dim, i intermediate, a = 2 for bf16/fp16 compute else 4,
r = bytes of the residual stream: 4 when weights are fp32, else 2). Counted
tensor by tensor from what PyTorch autograd saves in transformers' Qwen2 layer
with sdpa attention (no attention matrix is stored):

- full: 2 RMSNorms x (4h fp32 input + r*h normalised + a*h cast for the
  projection) + a(q + 2k) rotated q, k and v + 2a*q (attention output, o_proj
  input) + 4a*i (gate, SiLU, up, product);
- LoRA (frozen base; a frozen matmul saves no input): 2 x 4h + a(q + 2k) + a*q +
  3a*i, plus per adapted projection (1 + a) x in_features (dropout mask + the
  input cast for lora_A; a alone without dropout); Q-LoRA adds the inputs that
  bitsandbytes' 4-bit matmul saves, a(2h + q + i);
- Qwen3's q/k norms add (4 + 2a)(q + k) (full) or 4(q + k) (LoRA);
- gradient checkpointing (non-reentrant, per layer) keeps r*h per token per
  layer and recomputes one layer at a time in backward.
- full fine-tuning through the worker's compiled layers (`RunShape.compiled`, a
  dense model): Inductor's partition of the layer's graph recomputes the norms'
  and SwiGLU's pointwise work and keeps r*h (the layer's input) + a(3h + 2q + 2k
  + 3i); under autocast over fp32 weights three more hidden-sized casts, a*6h.
  Counted with the same partitioner on the CPU (torch's min-cut, as Inductor
  calls it) and against the worker's memory probes on an H200: 4.27 MiB a token
  for 7B full under ZeRO-3 (probed 4.29), 2.30 for 1.5B with fp32 weights
  (probed 2.21), where the eager count says 6.24 and 3.03. A LoRA layer keeps
  the eager count (7.5 MiB a token for 7B; probed 6.5, so it errs high).

Logits and loss: transformers' causal-LM loss upcasts the logits to fp32 and
log_softmax saves its fp32 output; its backward holds that output, the incoming
gradient and its result together: 12 bytes x tokens x vocab (the bf16 logits held
by the output are dropped before backward). The end of the forward holds 10 bytes
x tokens x vocab. The worker's own fused loss (its default; `RunShape.fused_loss`,
set from a preset unless extra_args say --fused_ce off) computes the loss and its
gradients a chunk of rows at a time in the forward: 10 bytes x a chunk's rows x
vocab at the end of the forward, and the hidden states' fp32 gradient (4 bytes x
tokens x hidden) kept for backward. DPO (`RunShape.stage`) always runs the worker's own head: the answers'
float32 log-probabilities a chunk at a time, nothing of them kept but one float a token (4 x tokens), and the
chunk recomputed in the backward with its gradients: 10 bytes x a chunk's rows x vocab at the end of the forward
(as the fused loss) and 16 at the start of the backward, while every activation is alive (training/fast/
preference.py's token_logps, its peaks over the chunk's rows x vocab read from the profiler's memory events on
CPU; SFT's chunked loss reads 8 and 0 there). A DPO micro-batch of per_device_train_batch_size pairs holds twice
that many sequences (`RunShape.sequences`): micro-batch figures (max_micro_batch) stay in pairs.

Overhead, on top of what torch allocates: the CUDA context (0.6 GiB), cuBLAS
workspaces (0.0645 GiB, measured), NCCL buffers (0.5 GiB when N > 1), DeepSpeed's
reduce/all-gather buckets (4.5x bucket size with overlap_comm, DeepSpeed's
documentation), and allocator fragmentation: 10% of the step's transient tensors
(measured reserved - allocated on the H200 ranged 2-30%).

Checked against: DeepSpeed's own estimators (model states, exactly) in
tests/unit/test_estimate.py, and peak memory measured on one H200
(tests/fixtures/peak_memory_h200.csv: every row within 2.5%; the test allows 15%).

"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..model.spec import LORA_TARGETS_ALL, ModelSpec

GIB = 1024**3

CUDA_CONTEXT_GIB = 0.6
CUBLAS_WORKSPACE_GIB = 0.0645  # measured on the H200: allocated by the first matmul of a process
NCCL_BUFFERS_GIB = 0.5
FRAGMENTATION = 0.10
DS_BUCKET_ELEMENTS = 200_000_000  # training/ds_config_zero2.json reduce/allgather bucket sizes
DS_OVERLAP_FACTOR = 4.5  # DeepSpeed docs: overlap_comm uses 4.5x the bucket sizes
QUANT_BYTES = {4: 0.52, 8: 1.02}


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_gib: float
    bf16_tflops: float  # dense
    hbm_gbs: float
    intra_node_gbs: float  # NCCL bus bandwidth inside one node (NVLink or PCIe)
    # FP8 tensor cores that the worker's --fp8 uses (NVIDIA compute capability 8.9 or newer); None: not known here
    fp8: bool | None = False


# Datasheet numbers (dense bf16, no sparsity); memory as nvidia-smi's memory.total / 1024.
GPUS: dict[str, GPUSpec] = {g.name: g for g in (
    GPUSpec("H200", 143771 / 1024, 989, 4800, 360, fp8=True),
    GPUSpec("H100", 81559 / 1024, 989, 3350, 360, fp8=True),
    GPUSpec("H100-PCIe", 81559 / 1024, 756, 2000, 25, fp8=True),
    GPUSpec("B200", 183359 / 1024, 2250, 8000, 720, fp8=True),
    GPUSpec("A100-80G", 81920 / 1024, 312, 2039, 230),
    GPUSpec("A100-40G", 40960 / 1024, 312, 1555, 230),
    GPUSpec("L40S", 46068 / 1024, 362, 864, 25, fp8=True),
    GPUSpec("A10", 23028 / 1024, 125, 600, 25),
    GPUSpec("L4", 23034 / 1024, 121, 300, 25, fp8=True),
    GPUSpec("RTX4090", 24564 / 1024, 165, 1008, 25, fp8=True),
    GPUSpec("V100-32G", 32768 / 1024, 125, 900, 130),
    GPUSpec("MI300X", 196592 / 1024, 1307, 5300, 300, fp8=None),  # FP8 there is ROCm's: not measured
)}


def gpu_spec(name: str, memory_mib: int | None = None) -> GPUSpec | None:
    """Matches a table key (`H100`) or what nvidia-smi prints (`NVIDIA A100-SXM4-40GB`)."""
    if name in GPUS:
        return GPUS[name]
    n = name.upper().replace("NVIDIA", "").replace("GEFORCE", "").replace(" ", "").replace("_", "-")
    for key in sorted(GPUS, key=len, reverse=True):
        k = key.upper()
        base = k.split("-")[0]
        if base not in n:
            continue
        if k == "H100-PCIE" and "PCIE" not in n:
            continue
        if k.startswith("A100"):
            want_40 = "40G" in n or (memory_mib is not None and memory_mib < 60_000)
            if (k == "A100-40G") != want_40:
                continue
        return GPUS[key]
    return None


# ---------------------------------------------------------------- the run's parameters

@dataclass(frozen=True)
class RunShape:
    """What the estimate needs from `preset.training`, with overrides applied."""

    method: str = "lora"
    zero_stage: int | None = 2
    offload: str = "none"
    precision: str = "bf16"
    seq: int = 2048
    micro_batch: int = 1
    grad_accum: int = 1
    gradient_checkpointing: bool = True
    lora_r: int = 64
    lora_dropout: float = 0.05
    lora_targets: tuple[str, ...] = LORA_TARGETS_ALL
    master_fp32: bool | None = None  # full, no ZeRO: fp32 weights + autocast (True) or pure half (False)
    # the worker's fused loss (training/fast/loss.py: Liger's, or chunked in torch): the logits exist a chunk at a
    # time. A preset's run has it unless extra_args say --fused_ce off; a bare RunShape is the plain path.
    fused_loss: bool = False
    stage: str = "sft"  # dpo: micro_batch counts pairs, two sequences each, through DPO's own head and loss
    # the worker's --fp8 (auto, on, off: training/fast/fp8.py) and whether its layers are compiled (--no_compile in
    # extra_args, or training.device cpu: no); a bare RunShape runs bf16
    fp8: str = "off"
    compiled: bool = True
    sequence_parallel: int = 1  # ranks sharing each packed row (training.sequence_parallel_size)

    @classmethod
    def of(cls, training: Any = None, **overrides: Any) -> "RunShape":
        """From a preset's Training (or anything with its attribute names); overrides by RunShape names."""
        if isinstance(training, RunShape):
            base = asdict(training)
        elif training is None:
            base = {}
        else:
            def g(k, d):
                return getattr(training, k, d)

            targets = g("lora_target_modules", None)
            base = dict(
                method=g("method", "lora"), zero_stage=g("zero_stage", 2), offload=g("offload", "none"),
                precision=g("precision", "bf16"), seq=g("model_max_length", 2048),
                micro_batch=g("per_device_train_batch_size", 1), stage=g("stage", "sft"),
                grad_accum=g("gradient_accumulation_steps", 1),
                gradient_checkpointing=g("gradient_checkpointing", True), lora_r=g("lora_r", 64),
                lora_dropout=g("lora_dropout", 0.05),
                lora_targets=tuple(targets) if targets else LORA_TARGETS_ALL,
                fused_loss=_fused_loss(g("extra_args", None) or []),
                fp8=_flag_value(g("extra_args", None) or [], "--fp8") or g("fp8", "auto"),
                # the worker compiles its layers on CUDA only (training/fast/compile.py)
                compiled=("--no_compile" not in [str(a) for a in (g("extra_args", None) or [])]
                          and g("device", "auto") != "cpu"),
                sequence_parallel=int(g("sequence_parallel_size", 1) or 1),
            )
        base.update({k: v for k, v in overrides.items() if v is not None or k == "zero_stage"})
        if "lora_targets" in base:
            base["lora_targets"] = tuple(base["lora_targets"])
        return cls(**base)

    @property
    def sequences(self) -> int:
        """Sequences a sample of micro_batch puts through the policy, forward and backward: DPO's pair two, its
        chosen and rejected answers (the reference's forward runs once before training: advice DPO_COST)."""
        return 2 if self.stage == "dpo" else 1

    @property
    def tokens(self) -> int:
        return self.seq * self.micro_batch * self.sequences

    @property
    def half(self) -> bool:
        return self.precision in ("bf16", "fp16")


def _fused_loss(extra_args: list) -> bool:
    """Whether the worker computes the loss fused (its default) with these extra_args: not with --fused_ce off."""
    args = [str(a) for a in extra_args]
    for i, a in enumerate(args):
        if a == "--fused_ce=off" or (a == "--fused_ce" and i + 1 < len(args) and args[i + 1] == "off"):
            return False
    return True


def _flag_value(extra_args: list, name: str) -> str | None:
    """The last value extra_args give a worker flag (argparse's last one wins): `--fp8 on` or `--fp8=on`."""
    args, got = [str(a) for a in extra_args], None
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            got = a.split("=", 1)[1]
        elif a == name and i + 1 < len(args):
            got = args[i + 1]
    return got


FUSED_CE_ROWS = 4096  # the chunked loss's rows a chunk (training/fast/loss.py; Liger's are 2,048: this is the larger)


def _logits_bytes(run: RunShape, T: int, V: int, h: int) -> tuple[float, float]:
    """(end of forward, start of backward) bytes of logits and loss: transformers' loss keeps the fp32 logits and
    softmax of every token (module docstring); the worker's fused loss one chunk of rows at a time (bf16 logits,
    their fp32 softmax and gradient), and the gradient of the hidden states it computes in the forward."""
    if run.stage == "dpo":  # DPO's head: float32 log-probabilities, recomputed chunk by chunk in the backward
        chunk = min(T, FUSED_CE_ROWS)
        return 10.0 * chunk * V + 4.0 * T, 16.0 * chunk * V + 4.0 * T
    if not run.fused_loss:
        return 10.0 * T * V, 12.0 * T * V
    kept = 4.0 * T * h
    return 10.0 * min(T, FUSED_CE_ROWS) * V + kept, kept


@dataclass
class MemoryEstimate:
    """Peak memory of one GPU, GiB. The parts are what is alive at the peak moment
    (`phase`), so they add up to `total`; `peak_allocated` is what
    torch.cuda.max_memory_allocated would report (total minus context and fragmentation)."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    overhead: float
    total: float
    peak_allocated: float
    phase: str
    world_size: int = 1
    notes: list[str] = field(default_factory=list)

    def fits(self, gpu_gib: float) -> bool:
        return self.total <= gpu_gib

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 3)
        return d


# ---------------------------------------------------------------- memory

def _layer_act_bytes(spec: ModelSpec, run: RunShape, a: int, r: int) -> float:
    """Bytes autograd saves per token in one decoder layer (see the module docstring)."""
    h, q, k, i = spec.hidden, spec.q_dim, spec.kv_dim, spec.act_intermediate  # MoE: the k experts a token runs
    if run.method == "full" and run.compiled and not spec.is_moe:
        # The worker's compiled layer: its graph partitioned as Inductor does (recomputing the norms' and SwiGLU's
        # pointwise work), it keeps the layer's input, four (autocast over fp32 weights: seven) hidden-sized
        # tensors, q twice (rotated, and attention's output), k and v, and the MLP's gate, up and product
        b = r * h + a * ((6 if (r == 4 and a == 2) else 3) * h + 2 * q + 2 * k + 3 * i)
        if spec.qk_norm:
            b += (4 + 2 * a) * (q + k)  # not measured compiled: the eager count
        return b
    if run.method == "full":
        b = 2 * (4 + r + a) * h + a * (q + 2 * k) + 2 * a * q + 4 * a * i
        if spec.qk_norm:
            b += (4 + 2 * a) * (q + k)
        return b
    b = 2 * 4 * h + a * (q + 2 * k) + a * q + 3 * a * i
    per_in = (1 + a) if run.lora_dropout > 0 else a
    shapes = spec.module_shapes()
    for t in run.lora_targets:
        if t in shapes:
            b += per_in * shapes[t][0] + a * run.lora_r
    if spec.qk_norm:
        b += 4 * (q + k)
    if run.method == "qlora":
        b += a * (2 * h + q + i)
    return b


def _model_states(spec: ModelSpec, run: RunShape, world: int) -> tuple[float, float, float, float, list[str]]:
    """(weights, gradients, optimizer, autocast weight copies) in bytes, and notes."""
    P = spec.total_params
    notes: list[str] = []
    lora = run.method in ("lora", "qlora")
    Pt = spec.lora_params(run.lora_r, list(run.lora_targets)) if lora else P
    Pf = P if lora else 0  # frozen base (LoRA adds its own params on top)
    if run.method == "qlora":
        bits = spec.quant_bits or 4
        quantized = spec.layers * spec.layer_linear_params
        # kbit preparation keeps the rest (embeddings, norms, head) in fp32; ZeRO-3 converts it to the run's half
        # dtype as it partitions it, with the 4-bit weights (stored in that dtype) beside it
        rest = 2 if (run.zero_stage == 3 and run.half) else 4
        frozen_bytes = quantized * QUANT_BYTES.get(bits, 0.52) + (P - quantized) * rest
    else:
        frozen_bytes = Pf * (2 if run.half else 4)
    largest = spec.largest_layer_params
    zs = run.zero_stage
    w: float  # bytes a GPU holds of weights, gradients and optimizer states
    g: float
    o: float
    if zs is None or not run.half:
        if zs is not None and not run.half:
            notes.append("ZeRO without bf16/fp16 estimated like plain data parallel")
        if lora:
            w, g, o = frozen_bytes + 4 * Pt, 4 * Pt, 8 * Pt
            cache = 2 * Pt if run.half else 0
            if run.method == "qlora" and run.half:
                cache += 2 * spec.vocab * spec.hidden  # the fp32 lm_head, cast for its matmul
        else:
            master = run.master_fp32 if run.master_fp32 is not None else True
            pb = 4 if (master or not run.half) else 2
            w, g, o = pb * P, pb * P, 2 * pb * P
            cache = 2 * spec.matmul_params if (pb == 4 and run.half) else 0
        if world > 1:
            g += g  # DDP's gradient buckets are a second copy (gradient_as_bucket_view=False)
        return w, g, o, cache, notes
    # DeepSpeed with bf16/fp16: the module runs in half precision, fp32 master in the optimizer.
    if zs == 2:
        if run.offload != "none":
            w, g, o = 2 * Pt, 0, 0
        else:
            w, g, o = 2 * Pt, 6 * Pt / world, 12 * Pt / world  # gradients partitioned too (stage 2)
        w += frozen_bytes if lora else 0
    else:
        if run.offload == "all":
            w, g, o = 4 * largest, 0, 0
        elif run.offload == "optimizer":
            w, g, o = 4 * largest + 2 * Pt / world, 0, 0
        else:
            # DeepSpeed's 18 bytes/param over N: 2 bf16 weight shard + 4 gradient + 12 fp32 master and Adam
            w, g, o = 4 * largest + 2 * Pt / world, 4 * Pt / world, 12 * Pt / world
        if lora and run.offload != "all":
            w += frozen_bytes / world
    return w, g, o, 0, notes


def estimate_memory(spec: ModelSpec, training: Any = None, world_size: int = 1, **overrides: Any) -> MemoryEstimate:
    """Peak memory per GPU for `training` (a preset's Training or a RunShape) on `world_size` GPUs.

    Overrides take RunShape names (micro_batch=4, gradient_checkpointing=False, zero_stage=2, ...).
    """
    run = RunShape.of(training, **overrides)
    world = max(1, int(world_size))
    w, g, o, cache, notes = _model_states(spec, run, world)
    ds = run.zero_stage is not None and run.half
    lora = run.method in ("lora", "qlora")
    a = 2 if run.half else 4
    fp32_weights_amp = run.half and not ds and (run.method == "qlora" or (not lora and (run.master_fp32 is not False)))
    r = 4 if (not run.half or fp32_weights_amp) else 2
    T, V, h, L = run.tokens, spec.vocab, spec.hidden, spec.layers
    layer = _layer_act_bytes(spec, run, a, r) * T
    final_norm = (4 + (r if not lora else 0)) * h * T
    lm_cast = 2 * V * h if (cache and (not lora or run.method == "qlora")) else 0
    grads_in_fwd = g if (run.grad_accum > 1 or ds) else 0.0
    transient_tied = 4 * V * h if (not lora and spec.tied_embeddings and not ds) else 0

    phases: list[tuple[str, float, float, float, float]] = []  # name, weights+, grads, acts, logits
    lg_fwd, lg_bwd = _logits_bytes(run, T, V, h)
    if run.gradient_checkpointing:
        ckpt = L * r * h * T
        fwd_end = (cache, grads_in_fwd, ckpt + final_norm, lg_fwd)
        bwd_start = (lm_cast, grads_in_fwd, ckpt + final_norm, lg_bwd)
        layer_cast = (cache - lm_cast) / max(L, 1)
        recompute = (lm_cast + layer_cast, g, ckpt + 2 * layer, 0.0)  # the layer and its input gradients
        phases += [("end of forward", *fwd_end), ("loss backward", *bwd_start), ("layer recompute", *recompute)]
    else:
        acts = L * layer + final_norm
        phases += [("end of forward", cache, grads_in_fwd, acts, lg_fwd),
                   ("loss backward", cache, grads_in_fwd, acts, lg_bwd)]
    phases.append(("end of backward", 0.0, g + transient_tied, 0.0, 0.0))
    name, extra_w, grads, acts, logits = max(phases, key=lambda p: p[1] + p[2] + p[3] + p[4])

    buffers = 0.0
    if ds and world > 1:
        trainable = spec.lora_params(run.lora_r, list(run.lora_targets)) if lora else spec.total_params
        if run.zero_stage == 2:
            buffers = 2 * DS_OVERLAP_FACTOR * min(DS_BUCKET_ELEMENTS, trainable)
        else:
            buffers = 2 * 2 * h * h  # reduce bucket (h^2) and prefetch bucket (0.9 h^2), bf16
    transient = extra_w + acts + logits + max(0.0, grads - (g if grads_in_fwd else 0.0))
    workspace = CUBLAS_WORKSPACE_GIB * GIB
    allocated = w + extra_w + grads + o + acts + logits + workspace + buffers
    overhead = workspace + buffers + CUDA_CONTEXT_GIB * GIB + FRAGMENTATION * transient
    if world > 1:
        overhead += NCCL_BUFFERS_GIB * GIB
    total = w + extra_w + grads + o + acts + logits + overhead
    if run.offload != "none" and not ds:
        notes.append("offload needs DeepSpeed ZeRO: ignored")
    return MemoryEstimate(
        weights=(w + extra_w) / GIB, gradients=grads / GIB, optimizer=o / GIB, activations=acts / GIB,
        logits=logits / GIB, overhead=overhead / GIB, total=total / GIB, peak_allocated=allocated / GIB,
        phase=name, world_size=world, notes=notes,
    )


# Host memory of an offloading run, per node (DeepSpeed's estimate_zero2/3_model_states_mem_needs with zero.Init):
# the offloaded fp32 master weights, Adam's two moments and fp32 gradients, 16 bytes per trainable parameter (18 with
# the parameters offloaded too), shared by the nodes, times DeepSpeed's buffer factor; with every parameter offloaded
# a frozen base's 16-bit weights too. Beside it each rank's own process (torch, CUDA, the data): HOST_PER_RANK_GIB.
DS_HOST_BUFFER_FACTOR = 1.5
HOST_PER_RANK_GIB = 4.0


def host_memory_gib(spec: ModelSpec, training: Any, nodes: int, gpus_per_node: int, **overrides: Any) -> float:
    """Host memory one node needs for `training` (GiB): what ZeRO offload puts there, and each rank's process."""
    run = RunShape.of(training, **overrides)
    nodes, g = max(1, nodes), max(1, gpus_per_node)
    lora = run.method in ("lora", "qlora")
    Pt = spec.lora_params(run.lora_r, list(run.lora_targets)) if lora else spec.total_params
    offloaded = 0.0
    if run.zero_stage is not None and run.offload != "none":
        per_param = 18 if run.offload == "all" and run.zero_stage == 3 else 16
        offloaded = Pt * per_param / nodes * DS_HOST_BUFFER_FACTOR
        if lora and run.offload == "all" and run.zero_stage == 3:
            offloaded += 2 * spec.total_params / nodes
    return offloaded / GIB + HOST_PER_RANK_GIB * g


def max_micro_batch(spec: ModelSpec, training: Any, world_size: int, gpu_gib: float, limit: int = 4096,
                    **overrides: Any) -> int:
    """Largest micro-batch whose estimate fits in gpu_gib (0 if not even 1 fits). Memory grows with it."""
    overrides.pop("micro_batch", None)

    def fits(mb: int) -> bool:
        return estimate_memory(spec, training, world_size, micro_batch=mb, **overrides).fits(gpu_gib)

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
