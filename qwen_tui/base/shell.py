"""Shell quoting and the detached-job wrapper, on the ground floor: the plan (pure), the
transports and the exports all render argv lists as command lines, so the helpers
live below them all. Nothing here runs anything."""

from __future__ import annotations

import shlex
from typing import Sequence


def quote_argv(argv: Sequence[str]) -> str:
    """One command line in which every argument is shlex-quoted (never pasted in)."""
    return " ".join(shlex.quote(a) for a in argv)


# The environment marks every process of a job carries (qwen_tui.nodes.jobs reads them back).
JOB_MARK = "QWEN_TUI_JOB_PGID"
RUN_MARK = "QWEN_TUI_RUN_ID"

# A detached job: run argv in `cwd`, output appended to `log`, exit code written to
# `rcfile` when it ends. The job is its own session/process group. torchrun starts
# every rank in a session of its own (start_new_session), so a signal to the group
# misses the ranks once the agent is dead: every process of the job also carries
# JOB_MARK=<pgid> and RUN_MARK=<run id> in its environment, and the stop finds them
# by both (qwen_tui.nodes.jobs says which processes may be signalled).
# The job's environment (which may hold secrets) never travels in argv: locally it
# is the child's environment; over SSH it is a 0600 file ($4) that the job sources
# and removes before it starts the command. The exit code goes through a temp file
# created with noclobber (O_EXCL), so a planted link is never written through.
# The log and exit-code files are made 0600 (umask 077); the command itself runs
# with the umask it was given.
JOB_SCRIPT = (
    f'export {JOB_MARK}=$$; u=$(umask); umask 077; '
    'cd -- "$1" || { echo "cannot cd to $1" >>"$2"; echo 97 >"$3"; exit 97; }; '
    'log=$2; rcf=$3; envf=$4; shift 4; : >>"$log"; '
    'if [ -n "$envf" ]; then . "$envf" || { echo "cannot read the job environment $envf" >>"$log"; '
    'rm -f -- "$envf"; echo 96 >"$rcf"; exit 96; }; rm -f -- "$envf"; fi; '
    'umask "$u"; "$@" >>"$log" 2>&1 </dev/null; rc=$?; umask 077; rm -f -- "$rcf.tmp"; '
    '(set -C; echo "$rc" >"$rcf.tmp") && mv -f -- "$rcf.tmp" "$rcf"'
)


def job_argv(argv: Sequence[str], cwd: str, log: str, rcfile: str, *, envfile: str = "",
             run_id: str = "") -> list[str]:
    """argv that runs `argv` as a job (JOB_SCRIPT); the leader carries RUN_MARK from its exec."""
    return ["env", f"{RUN_MARK}={run_id}", "sh", "-c", JOB_SCRIPT, "sh", cwd, log, rcfile, envfile, *argv]
