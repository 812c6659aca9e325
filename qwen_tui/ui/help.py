"""The help panel (F10 or `?`): what the step is for, what to do in it, and every key
it answers to, read from the live bindings so the list cannot drift from the keys."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Button, Label, Static

from .dialog import Dialog

# One text per step; a step screen's own HELP wins (StepScreen.help_text).
STEP_HELP = {
    "nodes": "The machines of this run, one row each. Node 0 is the master: it runs torchrun's rendezvous "
             "and writes the checkpoints. Add nodes one by one (a), or import a hostfile, a SLURM node list "
             "or the hosts of ~/.ssh/config (i). Probe (p) logs into every node at once and reads its GPUs, "
             "Python and libraries, disk and limits; differences between nodes show below the table with "
             "their fix. Removing a node asks first. k lets SLURM give the nodes instead: e then says what to ask "
             "it for (nodes, GPUs, partition, account, time...), and the Run step submits the batch job and follows "
             "it.",
    "ssh": "qwen-tui logs into every remote node with one key. k makes the key if it is missing and installs "
           "it on every node (the password is asked once and kept in memory only). c connects to every node; "
           "a host key never seen before is shown with its fingerprint and accepted only if you say so, a "
           "changed one is refused. v checks that every node reaches every other one.",
    "network": "Workers reach the master on one port (master port); collectives between nodes need "
               "bandwidth. r runs all the checks from every node: the master port, the firewall, iperf3 "
               "between each worker and the master. p, f and b run one of them again; s copies what a node lacks "
               "(data, model, code) from the master. A link under "
               "10 Gbit/s turns the step yellow: ZeRO-3 and full fine-tuning suffer most on it.",
    "training": "The recipe: model, data, method (full, LoRA, Q-LoRA), ZeRO stage, precision and batch. "
                "Every change is checked at once: a bad value shows its error under its field and the "
                "preset keeps the old value until it is fixed. The panel on the right recomputes the "
                "effective batch, memory per GPU, step time and scaling, and the advice list. Without a "
                "probe, pick the GPU type so memory is checked against it. FP8 matmuls: auto runs torchao's FP8 "
                "only where it was measured faster through the worker: a 7B-class or wider LoRA base without "
                "DeepSpeed or checkpointing, in rows of 8,192+ tokens (1.10x of bf16 on an H100); elsewhere it "
                "keeps bf16; on runs FP8 anyway, off keeps bf16; the advice says what FP8 gains or "
                "costs. F8 applies the highlighted "
                "advice's fix (Enter on the list too); advice without an automatic fix shows what to do. "
                "F9 previews the data as the worker will tokenize it. At the end, recovery: how many times a "
                "failed run is relaunched from its last complete checkpoint, whether the failed node is left "
                "out, when a run without a finished step counts as hung and what a hang does, and how long a "
                "node may stay unreachable before the run gives up on it.",
    "review": "Exactly what launch runs on every node (the same plan `qwen-tui replay` and the exports use), "
              "and the preset as YAML. l launches (it asks first when a check failed or the output directory "
              "already holds a run), x writes SLURM, PBS or shell scripts, ctrl+s saves the preset.",
    "run": "The cluster while it trains: one panel per node (GPU utilisation and memory, or CPU load), the "
           "master's loss curve, the log of one node (n shows the next node's). Above the log, what the monitor "
           "noticed, newest first: a node it cannot reach and then can again, a machine lost, a straggler, a "
           "hang and its end. When no step finishes within the hang bound, the node that holds the run is "
           "marked HUNG on its panel, and every rank's Python stack is collected into the run directory's "
           "stacks/ (a stopped rank's too where py-spy is installed on the node: pip install "
           "'qwen-tui[debug]'); k shows them. s stops every process on every node (it asks first). Quitting "
           "leaves the run going; reopening qwen-tui re-attaches. c chats with the trained model once the run "
           "has finished.",
}

GLOBAL_KEYS = ("F1-F6 go to a step (the bar on top shows each step's state: ✔ done, ! warning, ✘ problem, "
               "▶ running); F10 or ? opens this help; ctrl+p opens the command palette (every key of every step, "
               "go to a step, apply a fix, open or save a preset, theme); ctrl+s saves, ctrl+o opens a preset, "
               "ctrl+q quits (a run keeps running; reopening re-attaches); Tab moves between fields.")


def keys_text(bindings: list[Binding]) -> Text:
    t = Text()
    for b in bindings:
        if b.description:
            t.append(f"  {b.key_display or b.key:<12}", style="bold")
            t.append(f"{b.description}\n")
    return t


class HelpPanel(Dialog[None]):
    BINDINGS = [Binding("escape,enter,f10,question_mark", "close", "Close")]
    WIDE = True
    DIALOG_ID = "help"

    def __init__(self, title: str, body: str, keys: list[Binding]) -> None:
        super().__init__(f"Help: {title}")
        self.body, self.keys = body, keys

    def compose_body(self) -> ComposeResult:
        yield self.scrolling(self.text(self.body, id="help-body"), Label("Keys of this step", classes="section"),
                             Static(keys_text(self.keys), id="help-keys"), self.text(GLOBAL_KEYS))

    def compose_buttons(self) -> ComposeResult:
        yield Button("Close (esc)", id="close", variant="primary")

    def on_button_pressed(self, _: Button.Pressed) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)
