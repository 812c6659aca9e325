"""--warmup_steps with --num_train_epochs (HF: a count of optimizer steps that overrides --warmup_ratio), in a
real tiny run."""

from __future__ import annotations

import pytest

from support.worker import assert_ok, demo_records, run_worker, write_jsonl


@pytest.mark.slow
def test_warmup_steps_with_epochs_warms_up_over_that_many_steps(tmp_path, tiny_model):
    data = write_jsonl(tmp_path / "train.jsonl", demo_records()[:24])  # 6 steps an epoch at 4 records a step
    run = run_worker(tmp_path / "out", "--model_name_or_path", str(tiny_model), "--data_path", str(data),
                     "--per_device_train_batch_size", "4", "--model_max_length", "128", "--num_train_epochs", "2",
                     "--learning_rate", "1e-3", "--lr_scheduler_type", "linear", "--warmup_steps", "3",
                     "--warmup_ratio", "0.5", "--save_strategy", "no")
    assert_ok(run)
    assert "--warmup_steps" not in run.stderr  # no warning: it took effect
    lrs = {r["step"]: r["learning_rate"] for r in run.steps}
    assert sorted(lrs) == list(range(1, 13))
    # the rate a step ran with: 0, 1/3, 2/3 of the peak while warming up, the peak at step 4, then linear decay
    assert [lrs[s] for s in (1, 2, 3, 4)] == pytest.approx([0.0, 1e-3 / 3, 2e-3 / 3, 1e-3])
    assert lrs[8] == pytest.approx(1e-3 * (12 - 7) / (12 - 3))  # --warmup_ratio 0.5 would still be warming up
