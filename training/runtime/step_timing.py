"""Each rank's compute time and the time it waited for the others, per optimizer step, without a profiler.

wait = the time this rank spent blocked at the step's synchronising points after its own work there was done;
compute = the step's wall time - wait. A rank slower than the rest shows a larger compute; the others wait for it.
Every logged step (--logging_steps) the ranks gather [compute_s, wait_s, node_rank] once, and rank 0's metrics
record carries rank_compute_s, rank_wait_s (seconds per step over the window, indexed by global rank) and
rank_node (the node rank of each global rank).

The synchronising points measured:

(a) the gradient reduction of the micro-batch that synchronises (the last of the step) under DDP or DeepSpeed:
    from the moment backward reaches the first decoder layer (a hook on the gradient of layer 0's output,
    registered in that layer's forward when the output requires grad) until backward returns. By then the rank
    has only layer 0's own backward left (and the embedding's, in full fine-tuning); the rest is the last
    gradient buckets waiting for every rank. So (a) counts layer 0's backward as waiting: about 1/N of the
    backward of an N-layer model (a few percent for Qwen's 24-64 layers), the same on every rank. Without a
    gradient at layer 0's output (nothing trainable at or below it), (a) is not measured. With compiled layers
    the forward hook is traced into layer 0's call, which then compiles a graph of its own; the hook is
    registered before the memory probes, so that graph compiles there and not at a training step.
(b) the step's explicit collectives: the all-reduce of the token counts (padded batches; packed steps agree on
    them a step ahead) and of the step's loss.
(c) packed steps: the main thread waiting for the packing thread, as far as that thread was itself waiting in
    its gather of the ranks' row counts (the gather ends the packing job, so the overlap is the shorter of the two).

On CPU these are host clocks. On CUDA the host runs ahead of the GPU, so (a) and (b) are CUDA events on the
compute stream, read once per logged step after the step's loss has been read back (they are complete by then:
no synchronisation is added); (c) stays a host clock. The logging gather itself goes through a gloo group of its
own, on the host, and is not counted: it comes once per logged step, right after the loss all-reduce has lined
the ranks up.

Limits. Waits inside other work count as compute: under ZeRO-3 every layer gathers its weights from all ranks in
forward and backward, in lockstep, so a slow rank holds the others at each gather and their compute grows towards
the slow rank's; only the tail of the step (the final reductions, the explicit collectives) is seen as waiting.
The slowest rank, which never waits, still shows the largest compute, by a smaller margin. ZeRO's all-gather of
updated weights after the optimizer step likewise counts as compute.
"""

from __future__ import annotations

import time

import torch


class StepTimer:
    def __init__(self, device: torch.device, model, several: bool):
        """several: more than one rank (else nothing synchronises and every second is compute)."""
        self.cuda = device.type == "cuda"
        self.several = several
        self._spans: list[tuple[int, object, object]] = []  # (step, start, end): host seconds or CUDA events
        self._armed = False
        self._reached = None
        self.layer0 = _first_layer(model) if several else None
        if self.layer0 is not None:
            self.layer0.register_forward_hook(self._on_layer0_forward)

    # ------------------------------------------------------------------ clocks
    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()  # on this thread's current stream: the compute stream (autograd runs a node on its forward's)
        return ev

    @staticmethod
    def _seconds(start, end) -> float:
        if isinstance(start, float):
            return end - start
        end.synchronize()  # already complete when called after the step's read-back; a no-op then
        return start.elapsed_time(end) / 1000.0

    # ------------------------------------------------------------------ (a) the synchronising backward
    def _on_layer0_forward(self, module, args, output):
        out = output[0] if isinstance(output, (tuple, list)) else output
        # Always registered when there is a gradient to see: the choice of micro-batch is made when the gradient
        # arrives (armed), so the compiled layer's graph does not depend on it.
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(self._on_layer0_grad)

    def _on_layer0_grad(self, grad):
        if self._armed and self._reached is None:
            self._reached = self._now()

    def arm(self) -> None:
        """Before the backward of the micro-batch that synchronises the gradients."""
        if self.layer0 is not None:
            self._armed, self._reached = True, None

    def disarm(self, step: int) -> None:
        """After that backward returned: its wait, from layer 0 on, counts for `step`."""
        if self._armed and self._reached is not None:
            self._spans.append((step, self._reached, self._now()))
        self._armed, self._reached = False, None

    # ------------------------------------------------------------------ (b) and (c)
    def start(self):
        """Before an explicit collective: a token for end()."""
        return self._now() if self.several else None

    def end(self, step: int, token) -> None:
        if token is not None:
            self._spans.append((step, token, self._now()))

    def add_host_wait(self, step: int, seconds: float) -> None:
        if seconds > 0:
            self._spans.append((step, 0.0, seconds))

    # ------------------------------------------------------------------ reading
    def take(self, upto_step: int) -> float:
        """The waits of the steps up to `upto_step`, in seconds, forgotten once read (a step already under way,
        with --overlap_steps, keeps its own)."""
        done = [s for s in self._spans if s[0] <= upto_step]
        self._spans = [s for s in self._spans if s[0] > upto_step]
        return sum(self._seconds(a, b) for _, a, b in done)


def _first_layer(model):
    """Decoder layer 0 of a causal LM (through a peft wrapper), or None where the model has no such stack."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        layers = base.get_decoder().layers
    except AttributeError:
        return None
    return layers[0] if len(layers) else None


def per_rank(gathered: list[list[float]]) -> dict:
    """The metrics record's fields from every rank's [compute_s, wait_s, node_rank], in rank order."""
    return {"rank_compute_s": [g[0] for g in gathered], "rank_wait_s": [g[1] for g in gathered],
            "rank_node": [int(g[2]) for g in gathered]}
