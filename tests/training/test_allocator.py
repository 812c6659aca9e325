"""training.fast.allocator.configure: expandable segments go into PYTORCH_CUDA_ALLOC_CONF before torch starts CUDA,
without overriding what the user set there."""

from __future__ import annotations

import pytest

from training.fast.allocator import ENV, configure
from training.runtime.errors import InputError


def test_auto_and_explicit_on_add_the_setting_and_keep_the_users_other_options():
    env = {}
    assert configure(None, env)[0] is True and env[ENV] == "expandable_segments:True"
    env = {ENV: "max_split_size_mb:128"}
    on, why = configure(True, env)
    assert on and why == "as given" and env[ENV] == "max_split_size_mb:128,expandable_segments:True"


def test_off_leaves_the_environment_alone():
    env = {ENV: "max_split_size_mb:128"}
    assert configure(False, env) == (False, "off as given") and env == {ENV: "max_split_size_mb:128"}
    assert configure(False, {}) == (False, "off as given")


@pytest.mark.parametrize("conf,on", [("expandable_segments:True", True), (" expandable_segments : false ", False),
                                     ("garbage_collection_threshold:0.6,expandable_segments:True", True)])
def test_the_users_setting_wins_and_a_contradicting_flag_is_an_error(conf, on):
    env = {ENV: conf}
    assert configure(None, env) == (on, f"as set by {ENV}") and env[ENV] == conf
    assert configure(on, env)[0] is on
    with pytest.raises(InputError, match=("--no_expandable_segments" if on else "--expandable_segments") + " contradicts"):
        configure(not on, env)
    assert env[ENV] == conf
