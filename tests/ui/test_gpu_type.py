"""Training step without probe facts: memory is amber "GPU unknown: fit not checked" (never a green
"no warnings"), a GPU type select (the CLI's --gpu) checks the fit, and an unmeasured link
shows "not measured", never "100 % of linear"."""

from __future__ import annotations

import pytest
from textual.widgets import Select, Static

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.widgets.advice_list import AdviceList
from qwen_tui.wizard.state import OK, WARN
from support.paths import ROOT

pytestmark = pytest.mark.anyio
SIZE = (160, 48)
PRESET_7B = ROOT / "presets" / "qwen2.5-7b-lora-2node-zero2.yaml"


def estimate_text(scr) -> str:
    from rich.console import Console

    con = Console(width=200, record=True, file=open("/dev/null", "w"))
    con.print(scr.query_one("#estimate", Static).content)
    return con.export_text()


def advice_text(scr) -> str:
    lst = scr.query_one(AdviceList)
    return "\n".join(str(lst.get_option_at_index(i).prompt) for i in range(lst.option_count))


async def test_gpu_unknown_is_amber_and_a_gpu_type_checks_the_fit(tmp_path):
    app = WizardApp(str(PRESET_7B), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        scr = app.screen
        text = estimate_text(scr)
        assert "GPU unknown: fit not checked" in text and "of " not in text.split("memory per GPU", 1)[1][:30]
        assert "not measured" in text and "% of linear" not in text  # 2 nodes, no link measured
        # no GPU type and no link: speed is unknown with the way to learn it, never an assumed H100's figure
        rows = {ln.split()[0]: ln for ln in text.splitlines() if ln.strip()}
        assert "unknown" in rows["tokens/s"] and not any(ch.isdigit() for ch in rows["tokens/s"])
        assert "unknown" in rows["step"] and "pick a GPU type, or probe the nodes" in text
        assert app.state.step_status("training") == WARN
        if not app.state.advice:
            assert "GPU unknown" in advice_text(scr) and "✔ no warnings" not in advice_text(scr)

        scr.query_one("#gpu-type", Select).value = "L4"  # 22 GiB: the 7B LoRA run (~26 GiB) does not fit
        await pilot.pause()
        assert app.state.gpu == "L4"
        assert "GPU unknown" not in estimate_text(scr) and "22 GiB (smallest GPU)" in estimate_text(scr)
        assert "OOM" in [a.code for a in app.state.advice]

        scr.query_one("#gpu-type", Select).value = "H200"
        await pilot.pause()
        assert "OOM" not in [a.code for a in app.state.advice]
        # the GPU is known now, the link between the two nodes still is not
        text = estimate_text(scr)
        assert "measure the link between them (Network, F3)" in text and "between nodes" in text
        assert app.state.estimate.tokens_per_s is None
        assert "140 GiB (smallest GPU)" in estimate_text(scr)
        assert app.state.step_status("training") in (OK, WARN)  # WARN only from real warnings now
        assert not app.state.gpu_unknown

        scr.query_one("#gpu-type", Select).value = "probe"
        await pilot.pause()
        assert app.state.gpu is None and "GPU unknown: fit not checked" in estimate_text(scr)
        assert not app.state.dirty or app.state.path is not None  # the GPU type is the wizard's, not the preset's


async def test_probed_gpus_decide_and_the_select_steps_aside(tmp_path):
    from support.facts import slow_h200_facts

    app = WizardApp(str(PRESET_7B), facts=slow_h200_facts(25.0), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        assert app.screen.query_one("#gpu-type", Select).disabled
        assert "140 GiB (smallest GPU)" in estimate_text(app.screen) and not app.state.gpu_unknown
