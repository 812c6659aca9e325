"""`qwen-tui keys` with a passphrase-protected identity file, as a user runs it: the
password, then the passphrase; the key is installed and logs in with its passphrase."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from qwen_tui.nodes.connect import _ssh_config, resolve_target
from qwen_tui.nodes.transport.protocol import TransportError
from qwen_tui.nodes.transport.ssh import AuthFailed, SSHTransport
from qwen_tui.preset.schema import Preset
from support.cluster import PASSWORD, REPO, preset_dict

PASSPHRASE = "open sesame, 'quoted' $(not run)"


@pytest.fixture
def authorized_keys_restored(cluster):
    """The nodes' authorized_keys as they were before: the shared cluster's other tests count its keys."""
    files = [nd.home / ".ssh" / "authorized_keys" for nd in cluster.nodes]
    before = {f: f.read_bytes() for f in files if f.exists()}
    yield
    for f, data in before.items():
        f.write_bytes(data)


def test_keys_with_a_locked_identity_file_asks_the_passphrase_and_installs(cluster, sshdir, keyed, tmp_path,
                                                                           authorized_keys_restored):
    key = Ed25519PrivateKey.generate()
    priv = tmp_path / "id_locked"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                       serialization.BestAvailableEncryption(PASSPHRASE.encode())))
    priv.chmod(0o600)  # no .pub next to it: the passphrase is the only way to know the key
    d = preset_dict(cluster, sshdir)
    d["cluster"]["identity_file"] = str(priv)
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(d))
    res = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "keys", str(p)], input=f"{PASSWORD}\n{PASSPHRASE}\n",
                         text=True, capture_output=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    preset = Preset.model_validate(d)
    t = resolve_target(preset.cluster.nodes[1], preset, _ssh_config(preset))
    t.identity_files, t.look_for_keys = [str(priv)], False
    tr = SSHTransport(t, passphrase=PASSPHRASE).connect()  # the key alone, unlocked in memory
    try:
        assert tr.run(["true"], timeout=15).ok
    finally:
        tr.close()
    with pytest.raises((AuthFailed, TransportError)):
        SSHTransport(t, passphrase="wrong").connect()
