"""The Training step's FP8 field: auto keeps the matmuls bf16 (this preset's ZeRO-2 is where FP8 measured within
noise through the worker) and says nothing; FP8 on is said live in the advice with the ratio measured through the worker, and where the worker would
refuse it (a GPU without FP8 tensor cores, Q-LoRA) it is an error whose fix puts auto back."""

from __future__ import annotations

import pytest
from textual.widgets import Select

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.widgets.advice_list import AdviceList
from support.paths import ROOT

pytestmark = pytest.mark.anyio
PRESET_7B = ROOT / "presets" / "qwen2.5-7b-lora-2node-zero2.yaml"


def fp8_advice(app) -> list[tuple[str, str]]:
    return [(a.code, a.message) for a in app.state.advice if a.code.startswith("FP8")]


async def test_the_fp8_field_and_its_live_advice(tmp_path):
    app = WizardApp(str(PRESET_7B), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        scr = app.screen
        fp8 = scr.query_one("#training-fp8", Select)
        assert fp8.value == "auto" and app.state.preset.training.fp8 == "auto"
        assert fp8_advice(app) == []  # no GPU type yet: nothing is claimed

        scr.query_one("#gpu-type", Select).value = "H200"
        await pilot.pause()
        assert fp8_advice(app) == []  # auto: bf16 on an H200 too, under ZeRO-2
        fp8.value = "on"
        await pilot.pause()
        (on,) = fp8_advice(app)
        assert on[0] == "FP8_ON" and "FP8 matmuls on H200" in on[1] and "measured no faster: 1.03x" in on[1]
        assert "7B under ZeRO-2 in rows of 8,192" in on[1]
        assert "FP8_ON" in [a.code for a in scr.query_one(AdviceList).items]
        fp8.value = "auto"
        await pilot.pause()

        scr.query_one("#gpu-type", Select).value = "A100-80G"
        await pilot.pause()
        assert fp8_advice(app) == []  # auto keeps an A100 in bf16, quietly
        fp8.value = "on"
        await pilot.pause()
        assert app.state.preset.training.fp8 == "on"
        (err,) = fp8_advice(app)
        assert err[0] == "FP8_CANNOT_RUN" and "A100-80G has no FP8 tensor cores" in err[1]
        first = app.state.advice[0]
        assert first.code == "FP8_CANNOT_RUN"  # errors first: F8 applies its fix
        await pilot.press("f8")
        await pilot.pause()
        assert app.state.preset.training.fp8 == "auto" and fp8.value == "auto" and fp8_advice(app) == []

        scr.query_one("#gpu-type", Select).value = "H200"
        scr.query_one("#training-method", Select).value = "qlora"
        fp8.value = "on"
        await pilot.pause()
        (err,) = fp8_advice(app)
        assert err[0] == "FP8_CANNOT_RUN" and "Q-LoRA's 4-bit base" in err[1]
