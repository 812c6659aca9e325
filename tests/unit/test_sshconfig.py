"""ssh_config as OpenSSH reads it (nodes/transport/sshconfig.py): `ssh -G` output, Include expansion for the
paramiko fallback, and both readers giving the same targets. No network."""

from __future__ import annotations

import getpass
import os
import shutil

import pytest

from qwen_tui.nodes.connect import resolve_target
from qwen_tui.nodes.hostlists import parse_ssh_config
from qwen_tui.nodes.transport import sshconfig
from qwen_tui.nodes.transport.protocol import TransportError
from qwen_tui.preset.schema import Preset

SSH = shutil.which("ssh")
needs_ssh = pytest.mark.skipif(SSH is None, reason="no OpenSSH client on this machine")

# What OpenSSH 9.2 printed for `ssh -G -F cfg gpu7` (an excerpt; the order is ssh's own)
SSH_G_OUTPUT = """\
host gpu7
user train
hostname 10.1.2.7
port 2207
addressfamily any
connecttimeout 7
identityfile ~/.ssh/k_%h
identityfile /keys/%u-%r-%p
proxyjump bastion
userknownhostsfile /home/me/.ssh/kh_cluster /home/me/.ssh/known_hosts2
sendenv LANG
sendenv LC_*
"""
SSH_G_DEFAULTS = """\
host qwen-tui-defaults
user me
hostname qwen-tui-defaults
port 22
addressfamily any
connecttimeout none
identityfile ~/.ssh/id_rsa
identityfile ~/.ssh/id_ed25519
userknownhostsfile /home/me/.ssh/known_hosts /home/me/.ssh/known_hosts2
"""


def test_ssh_g_output_minus_the_defaults_is_what_the_config_set():
    got = sshconfig.parse_ssh_g(SSH_G_OUTPUT)
    assert got["identityfile"] == ["~/.ssh/k_%h", "/keys/%u-%r-%p"]
    cfg = sshconfig.configured(got, sshconfig.parse_ssh_g(SSH_G_DEFAULTS), "gpu7")
    assert cfg["user"] == "train" and cfg["hostname"] == "10.1.2.7" and cfg["port"] == "2207"
    assert cfg["proxyjump"] == "bastion" and cfg["connecttimeout"] == "7"
    assert cfg["userknownhostsfile"].split()[0] == "/home/me/.ssh/kh_cluster"
    # tokens expanded as ssh does when it uses the file: %h the HostName, %u the local user, %r the remote one
    assert cfg["identityfile"] == ["~/.ssh/k_10.1.2.7", f"/keys/{getpass.getuser()}-train-2207"]
    assert cfg["sendenv"] == ["LANG", "LC_*"]
    assert "addressfamily" not in cfg  # the default: not configured


def test_an_unknown_identity_token_is_an_error_naming_the_host():
    got = sshconfig.parse_ssh_g("hostname h\nidentityfile ~/.ssh/%C\n")
    with pytest.raises(TransportError, match=r"gpu1.*%C"):
        sshconfig.configured(got, {}, "gpu1")


def _tree(tmp_path):
    """~/.ssh with a main config that includes a glob of files, one of them including another."""
    ssh_dir = tmp_path / "dotssh"
    (ssh_dir / "conf.d").mkdir(parents=True)
    (ssh_dir / "config").write_text(
        "Host front\n"
        "    User frontuser\n"
        "    Include conf.d/*.conf\n"       # inside a block: OpenSSH returns to `front` after it
        "    Port 2201\n"
        "Include=extra/deep\n"              # the Key=value form, relative to ~/.ssh
        "Host *\n"
        "    User fallback\n")
    (ssh_dir / "conf.d" / "10-gpu.conf").write_text(
        "Host gpu1\n    HostName 10.9.0.1\n    User alice\n    Port 2222\n    ProxyJump front\n")
    (ssh_dir / "conf.d" / "20-more.conf").write_text(f"Host gpu2\n    Port 2223\n    Include {ssh_dir}/leaf\n")
    (ssh_dir / "conf.d" / "ignored.txt").write_text("Host gpu1\n    User wrong\n")
    (ssh_dir / "leaf").write_text("    User bob\n")
    (ssh_dir / "extra").mkdir()
    (ssh_dir / "extra" / "deep").write_text("Host = deep1\n    HostName 10.9.0.9\n")
    return ssh_dir


def test_the_fallback_expands_includes_as_openssh_finds_them(tmp_path):
    ssh_dir = _tree(tmp_path)
    cfg = sshconfig.load(None, use_ssh=False, ssh_dir=str(ssh_dir))
    assert isinstance(cfg, sshconfig.ParamikoConfig)
    gpu1 = cfg.lookup("gpu1")
    assert (gpu1["hostname"], gpu1["user"], gpu1["port"], gpu1["proxyjump"]) == ("10.9.0.1", "alice", "2222", "front")
    assert cfg.lookup("gpu2")["user"] == "bob"  # an Include inside an included file, at its block
    assert cfg.lookup("deep1")["hostname"] == "10.9.0.9"
    front = cfg.lookup("front")
    assert front["port"] == "2201"  # the line after the Include still belongs to `Host front`
    assert "2201" not in (cfg.lookup("gpu1")["port"], cfg.lookup("deep1").get("port"))
    assert cfg.lookup("other")["user"] == "fallback"


def test_an_include_loop_or_an_unreadable_file_is_a_clear_error(tmp_path):
    loop = tmp_path / "loop"
    loop.write_text(f"Include {loop}\n")
    with pytest.raises(TransportError, match="nested more than 16 deep"):
        sshconfig.load(str(loop), use_ssh=False, ssh_dir=str(tmp_path))
    with pytest.raises(TransportError, match="does not exist"):
        sshconfig.load(str(tmp_path / "nope"), use_ssh=False)
    bad = tmp_path / "bad"
    bad.write_text('Include "unclosed\n')
    with pytest.raises(TransportError, match="Include"):
        sshconfig.load(str(bad), use_ssh=False, ssh_dir=str(tmp_path))


def _preset(host, config):
    return Preset.model_validate({"cluster": {"nodes": [{"host": host, "gpus": 1}], "ssh_config": str(config)},
                                  "training": {"model": "builtin:tiny", "data": "builtin:demo-chat"}})


@needs_ssh
@pytest.mark.parametrize("use_ssh", [True, False], ids=["ssh -G", "paramiko+Include"])
def test_both_readers_give_the_same_target_for_a_host_in_an_included_file(tmp_path, use_ssh):
    inc = tmp_path / "conf.d"
    inc.mkdir()
    (inc / "gpu.conf").write_text(
        "Host gpu1\n    HostName 10.9.0.1\n    User alice\n    Port 2222\n    ProxyJump front\n"
        f"    IdentityFile {tmp_path}/id_%h\n    UserKnownHostsFile {tmp_path}/kh\n    ConnectTimeout 4\n")
    main = tmp_path / "config"
    main.write_text(f"Include {inc}/*.conf\nHost=front\n    HostName 10.9.0.254\n    User jump\n")
    cfg = sshconfig.load(str(main), use_ssh=use_ssh)
    assert isinstance(cfg, sshconfig.OpenSSHConfig if use_ssh else sshconfig.ParamikoConfig)
    p = _preset("gpu1", main)
    t = resolve_target(p.cluster.nodes[0], p, cfg)
    assert (t.user, t.hostname, t.port) == ("alice", "10.9.0.1", 2222)
    assert t.identity_files == [f"{tmp_path}/id_10.9.0.1"] and not t.look_for_keys
    assert t.known_hosts == f"{tmp_path}/kh" and t.connect_timeout == 4
    assert t.jump is not None and (t.jump.user, t.jump.hostname) == ("jump", "10.9.0.254")
    # nothing configured: the defaults, and the agent and ~/.ssh/id_* may still be tried
    q = _preset("plain", main)
    t = resolve_target(q.cluster.nodes[0], q, cfg)
    assert (t.user, t.hostname, t.port, t.jump) == (getpass.getuser(), "plain", 22, None)
    assert t.look_for_keys


@needs_ssh
def test_a_config_openssh_refuses_is_refused_naming_the_file_and_line(tmp_path):
    bad = tmp_path / "config"
    bad.write_text("Host gpu1\n    Prot 22\n")
    with pytest.raises(TransportError, match=rf"{bad}.*OpenSSH refuses it.*line 2"):
        sshconfig.load(str(bad))


@needs_ssh
def test_ssh_g_resolves_each_host_once(tmp_path, monkeypatch):
    main = tmp_path / "config"
    main.write_text("Host a\n    Port 2000\n")
    cfg = sshconfig.load(str(main))
    calls = []
    real = cfg._run
    monkeypatch.setattr(cfg, "_run", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert cfg.lookup("a")["port"] == "2000" and cfg.lookup("a")["port"] == "2000"
    assert [c[1] for c in calls] == ["qwen-tui-defaults", "a"]


def test_the_host_import_reads_every_spelling_and_included_files(tmp_path):
    ssh_dir = _tree(tmp_path)
    text = sshconfig.import_text(str(ssh_dir / "config"), ssh_dir=str(ssh_dir))
    assert [n["host"] for n in parse_ssh_config(text)] == ["front", "gpu1", "gpu2", "deep1"]
    assert [n["host"] for n in parse_ssh_config('host=a\nHOST = b "c"\nHost *.x !d e?\n  Host f g a\n')] == \
        ["a", "b", "c", "f", "g"]
    assert os.path.exists(ssh_dir / "config")  # read, not consumed


@needs_ssh
def test_a_host_that_looks_like_an_option_or_a_command_is_refused_and_runs_nothing(tmp_path):
    main = tmp_path / "config"
    main.write_text("Host *\n    ConnectTimeout 5\n")
    cfg = sshconfig.load(str(main))
    for host in (f"-oProxyCommand=touch {tmp_path}/pwned", f"a;touch {tmp_path}/pwned", "$(touch pwned)"):
        with pytest.raises(TransportError, match="cannot resolve .*invalid characters"):
            cfg.lookup(host)
    assert not list(tmp_path.glob("pwned*"))
