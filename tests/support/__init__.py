"""Helpers shared by the test folders (imported as `support.*`: tests/ is on the path, see pyproject's pytest
settings). Fixtures stay in the conftest.py files; what they and the tests build on lives here:

- paths: the repository root, the demo preset, the fixtures folder
- ports: a free TCP port on this machine
- procs: the processes of a run, found by their command line; the quiet-stop check of each node's log
- runs: a run directory as the launcher writes it, without training; the metrics records being written
- restarts: kill and hold the ranks of a local run, wait for its first checkpoint, the CLI in its own session
- demo_run: the demo preset replayed for real (`qwen-tui replay`)
- launch_api: the launch API driven as a face drives it, on the demo preset
- worker: the training worker run as users run it, its data files and metrics
- long_records: long multi-turn records and the worker's flags for them (long context, sequence parallelism)
- pilot, tmux: the app driven by Textual's Pilot, and in a real terminal through tmux
- fakehub: a Hugging Face hub cache laid out offline
- facts: cluster facts standing for two H200 nodes
- cluster, netns, login_user, field_run: the namespace cluster (sshd per node, the password scan), its login
  user, a run on it with faults injected from outside
"""
