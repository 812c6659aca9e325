"""The fine-tuning worker that torchrun starts on every node. Never imports qwen_tui.

The programs (`python -m training.X`) and the recipe sit at the top; each package below imports only the
ones under it (the import-linter contract in pyproject.toml checks it):

    finetune, chat, merge, tiny, datapreview   the programs
    recipe, step_loop, builders, dsconfig,     the recipe: set-up, the training loop, what it builds, the DeepSpeed
    args, hf_flags, preference                 config; the worker's flags; DPO's reference log-probabilities
    fast/          checkpoints/                the fast path (switches and kernels); checkpoints and resuming
    model/                                     loading, adapting and saving the model (and the tiny built-in ones)
    data/                                      chat records -> token ids, the tokenized cache, batches, data order
    runtime/                                   the process: errors, collectives, heartbeat, stop, timing, trackers
    flags                                      the flags' typed groups (WorkerFlags) and what set-up resolves
                                               of them (Resolved), read on every floor

demo_data/ holds the built-in demo chat set (`builtin:demo-chat`), the preference set (`builtin:demo-pref`) and the
scripts that write them; the shipped
DeepSpeed configs (ds_config_zero2.json, ds_config_zero3.json) sit beside dsconfig.py.
"""
