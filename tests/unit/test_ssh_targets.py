"""resolve_target: ssh_config applied to a preset node, ProxyJump chains included (no network)."""

import paramiko
import pytest

from qwen_tui.nodes.connect import MAX_JUMPS, resolve_target
from qwen_tui.nodes.transport.protocol import TransportError
from qwen_tui.preset.schema import Preset

CONFIG = """\
Host gpu2
    HostName 10.0.0.12
    User train
    ProxyJump alice@bastion:2222,gw
Host bastion
    HostName 192.0.2.1
    User bob
    ProxyJump outer
    IdentityFile /keys/bastion
Host gw
    Port 2200
Host gpu3
    ProxyJump [2001:db8::1]:2022
Host loop1
    ProxyJump loop2
Host loop2
    ProxyJump loop1
Host pc
    ProxyCommand ssh -W %h:%p bastion
Host badport
    ProxyJump gw:http
Host empty
    ProxyJump gw,,bastion
"""


def _resolve(host, config=CONFIG, **cluster):
    p = Preset.model_validate({"cluster": {"nodes": [{"host": host, "gpus": 1}], **cluster},
                               "training": {"model": "builtin:tiny", "data": "builtin:demo-chat"}})
    return resolve_target(p.cluster.nodes[0], p, paramiko.SSHConfig.from_text(config))


def _chain(t):
    out = []
    while t is not None:
        out.append((t.user, t.hostname, t.port))
        t = t.jump
    return out


def test_a_proxyjump_chain_is_followed_as_ssh_j_does():
    t = _resolve("gpu2")
    # gpu2 through gw, gw through bastion (the spec's user and port win over bastion's own entry),
    # and bastion through its own ProxyJump: only the first hop's is followed
    assert _chain(t)[0] == ("train", "10.0.0.12", 22)
    assert [(h, p) for _, h, p in _chain(t)[1:]] == [("gw", 2200), ("192.0.2.1", 2222), ("outer", 22)]
    assert _chain(t)[2][0] == "alice"
    assert t.jump.jump.identity_files == ["/keys/bastion"]  # each hop's own ssh_config entry applies
    assert t.jump.jump.label == "gpu2 via jump host bastion"
    assert _chain(_resolve("gpu3"))[1][1:] == ("2001:db8::1", 2022)
    assert _resolve("plain").jump is None


@pytest.mark.parametrize("host, message", [
    ("loop1", "loops back to loop1"),
    ("pc", "ProxyCommand, which qwen-tui does not run; use ProxyJump"),
    ("badport", "gives gw the port 'http', not a TCP port"),
    ("empty", "not a chain of 1 to 8"),
])
def test_a_proxy_setting_that_cannot_work_is_refused_naming_the_node(host, message):
    with pytest.raises(TransportError, match=message) as e:
        _resolve(host)
    assert str(e.value).startswith(host)


def test_a_chain_longer_than_the_bound_is_refused():
    hops = ",".join(f"h{i}" for i in range(MAX_JUMPS + 1))
    with pytest.raises(TransportError, match="not a chain of 1 to 8"):
        _resolve("far", f"Host far\n    ProxyJump {hops}\n")
    # each hop's own ProxyJump counts toward the bound too
    nested = "".join(f"Host h{i}\n    ProxyJump h{i + 1}\n" for i in range(MAX_JUMPS + 2))
    with pytest.raises(TransportError, match="not a chain of 1 to 8"):
        _resolve("h0", nested)


def test_the_connect_bound_grows_with_the_longest_jump_chain(tmp_path):
    from qwen_tui.nodes.connect import _most_hops

    cfg = tmp_path / "config"
    # OpenSSH (`ssh -G`) refuses the whole file over the empty hop: leave that entry out here
    cfg.write_text(CONFIG.replace("Host empty\n    ProxyJump gw,,bastion\n", ""))

    def preset_of(*hosts):
        return Preset.model_validate({
            "cluster": {"nodes": [{"host": h, "gpus": 1} for h in hosts], "ssh_config": str(cfg)},
            "training": {"model": "builtin:tiny", "data": "builtin:demo-chat"}})

    assert _most_hops(preset_of("plain", "gpu3")) == 1
    assert _most_hops(preset_of("plain", "gpu2", "pc")) == 3  # gw, bastion, and bastion's own outer; pc: its error
    assert _most_hops(preset_of("localhost", "plain")) == 0
