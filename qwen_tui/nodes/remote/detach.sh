# Starts a detached job (qwen_tui.nodes.ssh): sh -c SCRIPT sh LOG_DIR RC_DIR ENVFILE RUN_ID JOB_ARGV..., the
# job's environment on stdin. Makes the log and rc directories (0700), then `setsid` puts the job in a new
# session (pid = pgid) that outlives this SSH session; prints its pid. The environment goes into a 0600 file
# created with noclobber (O_EXCL: a planted link is not followed); the job sources and removes it (job.sh).
# The run mark (qwen_tui.nodes.jobs.RUN_MARK) is exported before setsid, so it is in the environment of every
# exec. Exit 98: the directories could not be made; 99: the environment file could not be written.
(umask 077 && mkdir -p -- "$1" "$2") || exit 98;
envf=$3; export QWEN_TUI_RUN_ID=$4; shift 4;
rm -f -- "$envf" && (umask 077 && set -C && cat >"$envf") || exit 99;
setsid "$@" </dev/null >/dev/null 2>&1 & echo "$!"
