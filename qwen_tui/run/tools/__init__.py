"""The worker's one-shot tools run on the master node (`python -m training.X` through node 0's transport, the
answer the last JSON line of its output): the data preview before a run, merge and chat after it.

json_tool.py     run one tool on the node and read its answer, or its own error line
data_preview.py  the data preview: the worker's counts of a preset's data, with the estimate's timing and advice
after.py         after a run: merge its adapter into the base, and talk to the result
"""
