"""What the wizard knows of each node's probe and SSH: a state word and, apart from it, why it failed."""

from qwen_tui.preset.schema import Cluster, Node, Preset, Training
from qwen_tui.wizard.state import BAD, OK, TODO, ProbeState, SshState, WizardState


def two_nodes() -> WizardState:
    return WizardState(Preset(name="t", cluster=Cluster(nodes=[Node(host="gpu-a"), Node(host="gpu-b")]),
                              training=Training(model="builtin:tiny", data="builtin:demo-chat")))


def test_a_failed_probe_keeps_its_reason_apart_and_turns_the_step_red():
    st = two_nodes()
    assert st.node(0).probe == ProbeState.NOT_PROBED == "not probed"
    st.node(0).probe_ok()
    st.node(1).probe = ProbeState.PROBING
    assert ProbeState(st.node(1).probe).busy and st.step_status("nodes") == TODO
    st.node(1).probe_failed("error: on the node: a message that starts with the word")
    assert st.node(1).probe is ProbeState.ERROR
    assert st.node(1).probe_error == "error: on the node: a message that starts with the word"  # not cut
    assert st.step_status("nodes") == BAD
    st.node(1).probe_ok()
    assert st.node(1).probe_error == "" and st.step_status("nodes") == OK


def test_ssh_states():
    st = two_nodes()
    for i in range(2):
        st.node(i).ssh = SshState.CONNECTED
    assert st.step_status("ssh") == OK
    st.node(1).ssh_failed("REMOTE HOST KEY CHANGED", refused=True)
    assert st.node(1).ssh is SshState.REFUSED and SshState(st.node(1).ssh).failed
    assert st.step_status("ssh") == TODO  # refused: not connected, and not an error of its own (as before)
    st.node(1).ssh_failed("connection refused")
    assert st.node(1).ssh is SshState.ERROR and st.step_status("ssh") == BAD
    assert st.node(1).ssh_error == "connection refused"
