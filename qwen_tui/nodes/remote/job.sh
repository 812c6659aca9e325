# A detached job (qwen_tui.nodes.jobs.job_argv): env QWEN_TUI_RUN_ID=ID sh -c SCRIPT sh CWD LOG RCFILE ENVFILE
# ARGV... runs ARGV in CWD, output appended to LOG, its exit code written to RCFILE when it ends. The job is
# its own session and process group. torchrun starts every rank in a session of its own (start_new_session),
# so a signal to the group misses the ranks once the agent is dead: every process of the job also carries
# QWEN_TUI_JOB_PGID=<pgid> and QWEN_TUI_RUN_ID=<run id> (qwen_tui.nodes.jobs' JOB_MARK and RUN_MARK) in its
# environment, and the stop finds them by both (qwen_tui.nodes.jobs says which processes may be signalled).
# The job's environment (which may hold secrets) never travels in argv: locally it is the child's
# environment; over SSH it is a 0600 file (ENVFILE) that the job sources and removes before it starts the
# command. The exit code goes through a temp file created with noclobber (O_EXCL), so a planted link is never
# written through. The log and exit-code files are made 0600 (umask 077); the command itself runs with the
# umask it was given. Exit code 97: no CWD; 96: the environment file could not be read (`command .`: a plain
# `.` that fails ends a non-interactive POSIX shell at once, before it could write the exit code).
export QWEN_TUI_JOB_PGID=$$; u=$(umask); umask 077;
cd -- "$1" || { echo "cannot cd to $1" >>"$2"; echo 97 >"$3"; exit 97; };
log=$2; rcf=$3; envf=$4; shift 4; : >>"$log";
if [ -n "$envf" ]; then
  command . "$envf" || { echo "cannot read the job environment $envf" >>"$log"; rm -f -- "$envf"; echo 96 >"$rcf"; exit 96; };
  rm -f -- "$envf";
fi;
umask "$u"; "$@" >>"$log" 2>&1 </dev/null; rc=$?; umask 077;
rm -f -- "$rcf.tmp"; (set -C; echo "$rc" >"$rcf.tmp") && mv -f -- "$rcf.tmp" "$rcf"
