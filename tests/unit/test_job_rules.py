"""The rules that decide which processes are a run's job (qwen_tui.nodes.jobs), on rows
as /proc gives them: only what proves it is the job may be signalled."""

from qwen_tui.nodes.jobs import JOB_MARK, RUN_MARK, JobRef, Proc, leader_alive, members, parse_stat, verdict

RUN = "20260101-120000-demo-0001"
MARKED = {RUN_MARK: RUN}


def P(pid, pgrp, start, marks=None, state="S"):
    return Proc(pid, pgrp, start, state, dict(marks or {}))


def test_the_leader_its_group_and_marked_ranks_are_the_job():
    procs = [P(100, 100, 5000, MARKED), P(101, 100, 5001), P(120, 120, 5100, {**MARKED, JOB_MARK: "100"}),
             P(130, 130, 5200, {RUN_MARK: "another-run", JOB_MARK: "100"}), P(140, 77, 10)]
    got = {p.pid for p in members(JobRef(100, 5000, RUN), procs)}
    assert got == {100, 101, 120}
    assert verdict(JobRef(100, 5000, RUN), procs)[0] == "ours"


def test_a_reused_pid_is_refused_but_the_jobs_marked_ranks_still_count():
    reused = [P(100, 100, 9999, MARKED)]  # same pid, later start: another process
    assert verdict(JobRef(100, 5000, RUN), reused) == ("refused", "pid 100 is another process (started at tick "
                                                                  "9999, the job at tick 5000)")
    with_rank = reused + [P(120, 120, 5100, {**MARKED, JOB_MARK: "100"})]
    assert {p.pid for p in members(JobRef(100, 5000, RUN), with_rank)} == {120}


def test_unmarked_process_zombies_and_pid_0_1_are_never_the_job():
    assert verdict(JobRef(100, 5000, RUN), [P(100, 100, 5000)])[0] == "refused"  # no run mark
    assert verdict(JobRef(100, 5000, RUN), [P(100, 100, 5000, MARKED, state="Z")])[0] == "gone"
    for pid in (0, 1, -1):
        assert verdict(JobRef(pid, 1, RUN), [P(1, 1, 1, {**MARKED, JOB_MARK: str(pid)})])[0] == "refused"
        assert members(JobRef(pid, 1, RUN), [P(1, 1, 1, {**MARKED, JOB_MARK: str(pid)})]) == []
    assert verdict(JobRef(100, None, RUN), [P(100, 100, 5000, MARKED)])[0] == "refused"  # no start recorded


def test_stat_with_spaces_and_parentheses_in_the_name():
    text = "4242 (evil) (name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 777 0 0"
    assert parse_stat(text) == ("S", 4242, 777)


def test_orphaned_ranks_keep_the_job_alive_but_not_its_leader():
    rank = P(120, 120, 5100, {**MARKED, JOB_MARK: "100"})
    ref = JobRef(100, 5000, RUN)
    assert leader_alive(ref, [P(100, 100, 5000, MARKED), rank])
    # shell and agent killed: the rank lives on, the leader (who writes the exit code) does not
    assert members(ref, [rank]) and not leader_alive(ref, [rank])
    assert not leader_alive(ref, [P(100, 100, 5000, MARKED, state="Z"), rank])
    assert not leader_alive(ref, [P(100, 100, 9999, MARKED), rank])  # the pid went to another process
    assert leader_alive(JobRef(100, None, RUN), [P(100, 100, 7, MARKED)])
    assert not leader_alive(JobRef(100, None, RUN), [P(100, 100, 7)])
