"""`qwen-tui keys` with a passphrase-protected identity file: no TypeError; the key is
known by its .pub file or read with the passphrase; what cannot work is said clearly."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from qwen_tui.nodes.keys import KeyLocked, ensure_keypair, key_is_encrypted
from support.paths import ROOT


def _locked_key(d: Path, with_pub: bool) -> tuple[Path, str]:
    key = Ed25519PrivateKey.generate()
    priv = d / "id_locked"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                       serialization.BestAvailableEncryption(b"open sesame")))
    priv.chmod(0o600)
    line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    if with_pub:
        (d / "id_locked.pub").write_text(line + " me@here\n")
    return priv, line


def test_a_locked_key_is_known_by_its_pub_file(tmp_path):
    priv, line = _locked_key(tmp_path, with_pub=True)
    assert key_is_encrypted(str(priv))
    kp = ensure_keypair(str(priv))
    assert kp.encrypted and kp.public_line == line and not kp.created


def test_a_locked_key_without_pub_needs_its_passphrase(tmp_path):
    priv, line = _locked_key(tmp_path, with_pub=False)
    with pytest.raises(KeyLocked, match="protected by a passphrase"):
        ensure_keypair(str(priv))
    with pytest.raises(KeyLocked, match="wrong passphrase"):
        ensure_keypair(str(priv), passphrase="nope")
    assert ensure_keypair(str(priv), passphrase="open sesame").public_line == line


def test_keys_cli_with_a_locked_key_says_what_to_do_without_a_traceback(tmp_path):
    priv, _ = _locked_key(tmp_path, with_pub=False)
    (tmp_path / "ssh_config").write_text("")
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump({
        "cluster": {"nodes": [{"host": "192.0.2.10"}, {"host": "192.0.2.11"}], "identity_file": str(priv),
                    "ssh_config": str(tmp_path / "ssh_config"), "known_hosts": str(tmp_path / "kh"),
                    "connect_timeout": 1},
        "training": {"model": "builtin:tiny", "data": "builtin:demo-chat"}}))
    res = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "keys", str(p)], input="pw\n\n", text=True,
                         capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 2, res.stdout + res.stderr
    assert "protected by a passphrase" in res.stderr and "Traceback" not in res.stderr


def test_keys_cli_with_a_missing_ssh_config_is_a_clear_error(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump({
        "cluster": {"nodes": [{"host": "192.0.2.10"}], "ssh_config": str(tmp_path / "no-config")},
        "training": {"model": "builtin:tiny", "data": "builtin:demo-chat"}}))
    res = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "keys", str(p)], input="pw\n", text=True,
                         capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 2 and "no-config does not exist" in res.stderr and "Traceback" not in res.stderr
