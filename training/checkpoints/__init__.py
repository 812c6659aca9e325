"""Checkpoints: writing them, publishing them whole, and resuming from them.

directories       naming, completeness, rotation and atomic publication of checkpoint-N
checkpointer      what a run writes (checkpoints and the final save) and what a resumed run reads back
universal         resuming a DeepSpeed checkpoint on another number of processes
resume_agreement  which checkpoint to resume from when every node keeps its own
shared_output     --save_on_each_node on storage that is in fact shared, measured before anything is written
"""
