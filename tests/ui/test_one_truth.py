"""One truth per status: a node qwen-tui cannot log into shows the whole error and its fix on
the Nodes step, the same state on the SSH step, and Review says so (never "every check
passed", never a ✔ before anything ran); the Network toast says what the list and stepper say."""

from __future__ import annotations

import pytest
import yaml
from textual.widgets import Static

from qwen_tui.nodes.checks.findings import Finding
from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.screens.network import verdict
from qwen_tui.wizard.state import BAD, TODO, WARN, ProbeState, SshState
from support.facts import slow_h200_facts
from support.paths import DEMO
from support.ports import free_port

pytestmark = pytest.mark.anyio
SIZE = (160, 48)


def text_of(w) -> str:
    return str(w.render())


async def test_an_unreachable_node_shows_in_full_with_its_fix_everywhere(tmp_path, demo_copy):
    path = demo_copy()
    data = yaml.safe_load(path.read_text())
    port = free_port()  # nothing listens there: the connection is refused at once
    data["cluster"]["nodes"][1] = {"host": "127.0.0.2", "port": port, "user": "nobody", "gpus": 1,
                                   "workdir": str(tmp_path)}
    data["cluster"]["known_hosts"] = str(tmp_path / "known_hosts")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f5")
        await pilot.pause()
        summary = text_of(app.screen.query_one("#review-summary", Static))
        assert "every check passed" not in summary and "not probed yet" in summary
        assert app.state.step_status("review") == TODO
        await pilot.press("f1")
        await pilot.pause()
        await pilot.press("p")
        await app.workers.wait_for_complete()
        await pilot.pause()
        ns = app.state.node(1)
        assert ns.probe == ProbeState.ERROR and ns.probe_error
        findings = text_of(app.screen.query_one("#findings", Static))
        err = ns.probe_error
        assert f"✘ node 1 (127.0.0.2): {err}" in findings.replace("\n", " ") or err[:80] in findings
        assert "fix: check the host name and port" in findings
        assert findings.count("node 1 (") == 1
        assert str(port) in findings  # the whole message, not the table's cut
        await pilot.press("f2")
        await pilot.pause()
        assert app.state.node(1).ssh == SshState.ERROR and app.state.step_status("ssh") == BAD
        failures = text_of(app.screen.query_one("#ssh-failures", Static))
        assert "✘ node 1 (127.0.0.2):" in failures and str(port) in failures
        assert "fix: check the host name and port" in failures
        await pilot.press("c")  # connecting from the SSH step tells the same story
        await app.workers.wait_for_complete()
        await pilot.pause()
        failures = text_of(app.screen.query_one("#ssh-failures", Static))
        assert "✘ node 1 (127.0.0.2):" in failures and "fix: check the host name and port" in failures
        await pilot.press("f5")
        await pilot.pause()
        summary = text_of(app.screen.query_one("#review-summary", Static))
        assert "✘ Nodes (F1): cannot reach node 1 (127.0.0.2)" in summary
        assert "every check passed" not in summary and "no errors" not in summary
        assert app.state.step_status("review") == BAD


async def test_review_says_every_check_passed_only_when_they_did(tmp_path, demo_copy):
    from screenshots.snapshot_app import fixed_facts

    facts = fixed_facts()  # two probed nodes, a measured 6.2 Gbit/s link (a warning)
    links = facts.links
    facts.links = {}
    app = WizardApp(str(demo_copy()), facts=facts, runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f5")
        await pilot.pause()
        summary = text_of(app.screen.query_one("#review-summary", Static))
        assert "· Network (F3): not checked yet" in summary, summary
        assert "every check" not in summary and "✔" not in summary, summary
        for i in range(2):
            app.state.node(i).probe = "ok"
        app.state.facts.links, app.state.net_checked = links, True
        app.facts_changed()
        await pilot.pause()
        summary = text_of(app.screen.query_one("#review-summary", Static))
        assert "! Network (F3): under 10 Gbit/s: node 1 at 6.2 Gbit/s" in summary, summary
        assert "✔ every check ran and passed (warnings above)" in summary, summary


def test_network_toast_agrees_with_the_list_and_the_stepper(tmp_path):
    app = WizardApp(str(DEMO), facts=slow_h200_facts(2.0), runs_root=str(tmp_path / "runs"), reattach=False)
    st = app.state
    st.net_checked = True
    assert st.step_status("network") == WARN  # a 2 Gbit/s link: yellow in the stepper and the bars
    text, severity = verdict(st, [], "network checks")
    assert severity == "warning" and "passed" in text and "warning" in text  # was "network checks passed"
    probe_only = Finding("error", "VERSIONS", "torch differs", "", 1, "probe")  # the Nodes step's, not listed here
    low = Finding("warning", "LOW_BANDWIDTH", "2 Gbit/s", "", 1, "bandwidth")
    text, severity = verdict(st, [probe_only, low], "network checks")
    assert severity == "warning" and "LOW_BANDWIDTH" in text and "VERSIONS" not in text
    blocked = Finding("error", "PORT_BLOCKED", "node 1 cannot reach the master port", "", 1, "port")
    text, severity = verdict(st, [blocked], "port check", whole=False)
    assert severity == "error" and "PORT_BLOCKED" in text


async def test_k_with_no_node_reachable_says_it_made_a_key(tmp_path, demo_copy):
    path = demo_copy()
    data = yaml.safe_load(path.read_text())
    data["cluster"]["nodes"][1] = {"host": "127.0.0.2", "port": free_port(), "user": "nobody", "gpus": 1}
    data["cluster"]["known_hosts"] = str(tmp_path / "known_hosts")
    data["cluster"]["identity_file"] = str(tmp_path / "id_test")
    (tmp_path / "ssh_config").write_text("")  # not the machine's own: no Host entries apply
    data["cluster"]["ssh_config"] = str(tmp_path / "ssh_config")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        await pilot.pause()
        await pilot.press("k")
        await pilot.pause()
        await pilot.press(*"secret", "enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        if app.screen.is_modal:
            raise AssertionError(str(app.screen.query_one(".dialog-body").render()))
        pairs = text_of(app.screen.query_one("#pairs", Static))
        assert f"made a new key {tmp_path / 'id_test'}; installed on no node: none could be reached" in pairs
        assert (tmp_path / "id_test").exists() and app.state.node(1).ssh == SshState.ERROR


def test_step_levels_agree_with_check(tmp_path):
    """The colour a finding gives its step is the colour `qwen-tui check` prints it in."""
    from qwen_tui.cli.check import COLOURS
    from qwen_tui.cluster.facts import LinkFacts
    from qwen_tui.wizard.state import OK

    app = WizardApp(str(DEMO), facts=slow_h200_facts(25.0), runs_root=str(tmp_path / "runs"), reattach=False)
    st = app.state
    st.net_checked = True
    for i in range(2):
        st.node(i).probe = "ok"
    colour = {BAD: "bold red", WARN: "yellow", OK: "green"}
    for level in ("error", "warning", "info"):
        st.findings = [Finding(level, "GPUS", "differs", "", 1, "gpu")]
        assert colour[st.step_status("nodes")] == COLOURS[level], level
        st.findings = []
        st.net_findings = [Finding(level, "X", "m", "", 1, "port")]
        assert colour[st.step_status("network")] == COLOURS[level], level
    st.net_findings = []
    st.facts.links[1] = LinkFacts(port_reachable=True, bandwidth_gbps=25.0, firewall=["DROP tcp dpt:22"])
    assert st.step_status("network") == WARN  # FIREWALL_RULES is a warning in check
    st.facts.links[1] = LinkFacts(port_reachable=False, bandwidth_gbps=25.0)
    assert st.step_status("network") == BAD  # MASTER_PORT_UNREACHABLE is an error


async def test_each_finding_names_node_number_and_host_once(tmp_path):
    from screenshots.snapshot_app import fixed_facts

    facts = fixed_facts()
    facts.nodes[1].versions = {"torch": "2.9.0", "transformers": "5.17.0"}  # node 1 disagrees with node 0
    app = WizardApp(str(DEMO), facts=facts, runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        shown = text_of(app.screen.query_one("#findings", Static))
        per_node = [f for f in app.state.findings if f.node is not None]
        assert per_node, [f.code for f in app.state.findings]
        for f in per_node:
            line = next(ln for ln in shown.splitlines() if f" {f.code}: " in ln and f"node {f.node} " in ln)
            assert line.count("localhost") == 1, line  # the host once, with the node's number


async def test_a_user_side_failure_in_a_worker_is_not_called_a_bug(tmp_path, demo_copy):
    """k with a preset whose ssh_config file is missing: the modal names the file, not 'a bug in qwen-tui'."""
    path = demo_copy()
    data = yaml.safe_load(path.read_text())
    data["cluster"]["nodes"][1] = {"host": "127.0.0.2", "port": free_port(), "user": "nobody", "gpus": 1}
    data["cluster"]["ssh_config"] = str(tmp_path / "missing_ssh_config")
    data["cluster"]["identity_file"] = str(tmp_path / "id_test")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        await pilot.pause()
        await pilot.press("k")
        await pilot.pause()
        await pilot.press(*"secret", "enter")
        await app.workers.wait_for_complete()
        for _ in range(50):  # the failed worker's modal comes through a message: bounded wait
            if app.screen.is_modal:
                break
            await pilot.pause(0.1)
        body = str(app.screen.query_one(".dialog-body").render())
        assert "missing_ssh_config" in body and "does not exist" in body
        assert "bug in qwen-tui:" not in body.replace("not a bug in qwen-tui:", "")
        assert "could not finish" in str(app.screen.query_one(".dialog-title").render())
