"""Long records on one GPU: the MLP of every decoder layer computed in tiles of the sequence (--tiled_mlp).

At long context the largest activations of a decoder layer are its MLP's: gate, up, their product and the
SiLU, each tokens x intermediate (18,944 on Qwen2.5-7B, 5.3 times the hidden size), and with LoRA the
dropout copies of the projections' inputs. With gradient checkpointing one layer's activations are rebuilt at a
time in the backward, so the MLP's are what bounds the longest record. DeepSpeed's TiledMLP (Arctic Long
Sequence Training, deepspeed.runtime.sequence_parallel.ulysses_sp) runs the MLP tile by tile without keeping
anything but its input, and again tile by tile in the backward: the MLP then holds one tile's intermediates at a
time, for one more MLP forward a step. The rest of the long-context path is the worker's own: the loss never
builds the full logits (--fused_ce), packed rows attend with FlashAttention/cuDNN varlen (no attention matrix),
and the layers are checkpointed (--gradient_checkpointing).

Dropout (LoRA's, on adapted MLP projections) draws the same masks in a tile's recomputation as in its forward:
each tiled call takes a seed from the run's generator and every tile draws from its own seed.

Where it runs: one process; DeepSpeed ZeRO-1/2 (it tells the engine to reduce a weight's gradient once its last
tile is done); ZeRO-3 only where every rank runs rows of the same width (sequence parallelism over all ranks):
each tile gathers the partitioned weights, a collective every rank must make as often. Not under DDP, whose
gradient hooks fire once a backward.
"""

from __future__ import annotations

import logging
import math
import types

import torch

from training.flags import FastFlags, Resolved, TrainFlags
from training.runtime.errors import InputError

log = logging.getLogger("training")


# A rank's share of a row from which the MLP is tiled by default: there the MLP's intermediates of one layer
# (7B LoRA: ~190 KB a token) outweigh the extra MLP forward.
TILE_FROM_TOKENS = 32768


def _tiling_unfit(sp_size: int, world_size: int, stage: int | None, deepspeed: bool) -> str | None:
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        return "--tiled_mlp runs DeepSpeed's TiledMLP; pip install 'deepspeed>=0.19'"
    if world_size > 1 and not deepspeed:
        return ("--tiled_mlp under plain DDP is not supported (its gradient hooks fire once a backward); "
                "use --deepspeed builtin:zero2 or one process")
    if stage == 3 and world_size > 1 and sp_size != world_size:
        return ("--tiled_mlp under ZeRO-3 needs every rank to run rows of one width: use it with "
                f"--sequence_parallel_size {world_size} (all ranks), or with ZeRO-2")
    return None


def decide(resolved: Resolved, fast, world_size: int, stage: int | None, deepspeed: bool, *, train: TrainFlags,
           given: FastFlags, max_length: int, sequences: int = 1) -> None:
    """The long-context switches, before the model is built: --tiled_mlp (by default on where a rank's share of
    the longest record, --model_max_length `max_length`, is over TILE_FROM_TOKENS and tiling can run; refused where
    asked for and it cannot), and for records too long for the memory probe (two rows of one and two longest
    records; the second alone would not fit) one record's worth a row with gradient checkpointing instead of the
    probe. sequences: a sample's records, never split across rows (DPO: a pair's two answers, so the probe's rows
    are of one and two pairs, and a row without it holds one pair). Records in fast.why. What it resolves goes into `resolved` (the flags stay as given): tiled_mlp when not
    given, and in that last case packing_tokens and gradient_checkpointing (when not given)."""
    if train.tiled_mlp_tokens < 1:
        raise InputError(f"--tiled_mlp_tokens must be positive, got {train.tiled_mlp_tokens}")
    share = -(-max_length // train.sequence_parallel_size)
    unfit = _tiling_unfit(train.sequence_parallel_size, world_size, stage, deepspeed)
    if train.tiled_mlp is None:
        resolved.tiled_mlp = unfit is None and share > TILE_FROM_TOKENS
        fast.why["tiled_mlp"] = (f"on: records of up to {share} tokens a rank" if resolved.tiled_mlp
                                 else f"off: cannot run here ({unfit.split(';')[0]})" if unfit
                                 else f"off: records of up to {share} tokens a rank (tiled from {TILE_FROM_TOKENS})")
    elif train.tiled_mlp and unfit:
        raise InputError(unfit)
    else:
        fast.why["tiled_mlp"] = "as given"
    if resolved.tiled_mlp and fast.compile and given.compile is None:
        fast.compile = False
        fast.why["compile"] = "off: tiled MLP (its autograd function splits the layer's graph)"
    if fast.auto_micro_batch and given.auto_micro_batch is None and 2 * share * sequences > given.auto_max_tokens:
        fast.auto_micro_batch = False
        resolved.packing_tokens = max_length * sequences
        if resolved.gradient_checkpointing is None:
            resolved.gradient_checkpointing = True
        sample = "record" if sequences == 1 else "pair of such answers"
        fast.why["auto_micro_batch"] = (f"off: records of up to {max_length} tokens are past what the "
                                        f"probe measures (--auto_max_tokens): rows of one {sample}, checkpointed")


class _SeededTiles:
    """The MLP forward of one tiled call, tile i drawing its random numbers from seed + i, in the forward and
    again in the backward's recomputation (TiledMLP calls it for tiles 0..n-1, then 0..n-1 again). The
    recomputation also runs under the forward's autocast: the backward runs with autocast off, and bf16 inputs
    would then meet the adapters' fp32 weights (a dtype error on CUDA, where the worker trains under autocast)."""

    def __init__(self, forward, seed: int, tiles: int, device_type: str):
        self.forward, self.seed, self.tiles, self.calls = forward, seed, tiles, 0
        self.device_type = device_type
        self.autocast = torch.is_autocast_enabled(device_type)
        self.autocast_dtype = torch.get_autocast_dtype(device_type) if self.autocast else None

    def __call__(self, mlp, x):
        i = self.calls % self.tiles
        self.calls += 1
        devices = [x.device] if x.is_cuda else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed + i)
            if x.is_cuda:
                torch.cuda.manual_seed(self.seed + i)
            with torch.autocast(self.device_type, dtype=self.autocast_dtype, enabled=self.autocast):
                return self.forward(mlp, x)


def _tile_count(width: int, tile_tokens: int) -> int:
    """Tiles of at most tile_tokens that torch.chunk makes exactly (TiledMLP chunks into its count, and chunk
    may make fewer: 9 rows in 4 chunks are 3 of 3); the count it is given must be the one it gets."""
    tiles = math.ceil(width / tile_tokens)
    while True:
        made = math.ceil(width / math.ceil(width / tiles))
        if made == tiles:
            return tiles
        tiles = made


def tile_mlps(model, tile_tokens: int) -> int:
    """Replaces every decoder layer's MLP forward by the tiled one for inputs longer than `tile_tokens`
    (shorter ones run as before); returns how many."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    from training.fast.compile import decoder_of

    n = 0
    for layer in decoder_of(model).layers:
        mlp = layer.mlp
        plain = type(mlp).forward  # the class's forward: the module's own code, adapters included

        def tiled(self, x, _plain=plain):
            width = x.shape[-2]
            if width <= tile_tokens or not torch.is_grad_enabled():
                return _plain(self, x)
            tiles = _tile_count(width, tile_tokens)
            seed = int(torch.randint(0, 2**62, (1,)).item())  # the CPU generator: no device read
            params = [p for p in self.parameters() if p.requires_grad]
            return TiledMLP.apply(_SeededTiles(_plain, seed, tiles, x.device.type), self, x, tiles, params)

        mlp.forward = types.MethodType(tiled, mlp)
        n += 1
    return n
