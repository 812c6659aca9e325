"""Resuming when every node keeps its own checkpoints: the step all nodes agree on (training.resume_agreement)."""

from __future__ import annotations

import pytest

from training.errors import InputError
from training.resume_agreement import NodeHolds, choose


def _h(node, *steps, host=None):
    return NodeHolds(node, host or f"host{node}", frozenset(steps))


def test_newest_step_every_node_holds_wins_and_the_nodes_ahead_are_named(caplog):
    caplog.set_level("WARNING", logger="training")
    holds = [_h(0, 2, 4, 6), _h(0, 2, 4, 6), _h(1, 2, 4), _h(1, 2, 4)]
    assert choose(holds) == 4
    assert "checkpoint-4" in caplog.text and "node 0 (host0) has checkpoint-6" in caplog.text


def test_all_nodes_equal_resume_from_the_newest_quietly(caplog):
    caplog.set_level("WARNING", logger="training")
    assert choose([_h(0, 2, 4), _h(1, 2, 4), _h(2, 4, 2)]) == 4
    assert caplog.text == ""


def test_nothing_anywhere_starts_afresh():
    assert choose([_h(0), _h(1)]) is None


def test_no_common_step_refuses_naming_every_node():
    with pytest.raises(InputError) as e:
        choose([_h(0, 6), _h(1, 2, 4), _h(2)])
    msg = str(e.value)
    assert "no complete checkpoint in common" in msg
    assert "node 0 (host0): checkpoint-6" in msg and "node 1 (host1): checkpoint-2, checkpoint-4" in msg
    assert "node 2 (host2): none" in msg


def test_an_explicit_checkpoint_must_be_on_every_node():
    assert choose([_h(0, 4, 6), _h(1, 4)], want=4) == 4
    with pytest.raises(InputError, match=r"checkpoint-6 is not complete on every node; lacking it: node 1 "
                                         r"\(host1\): checkpoint-4$"):
        choose([_h(0, 4, 6), _h(1, 4)], want=6)


def test_two_ranks_of_one_node_that_see_different_lists_count_what_both_see():
    assert choose([_h(0, 2, 4), _h(0, 2), _h(1, 2, 4)]) == 2
