"""The master's hub download (qwen_tui/nodes/remote/hub_download.py), run with the plain system python3 in a
workdir of its own. A stand-in huggingface_hub on PYTHONPATH returns a snapshot laid out as the hub cache lays
it out (snapshot files are links to blobs), fails, or is missing; tests/launch/test_hub_model.py runs the real
library against a hub cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qwen_tui.nodes.programs import program

NODE_PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
DEST = ".qwen-tui/models/org--tiny"


def fake_hub(tmp_path: Path, body: str) -> Path:
    lib = tmp_path / "lib" / "huggingface_hub"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text(body)
    return lib.parent


def snapshot(tmp_path: Path) -> Path:
    """models--org--tiny: blobs, and a snapshot of relative links to them."""
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc123"
    (snap / "sub").mkdir(parents=True)
    for name, text in (("config.json", "{}"), ("sub/w.bin", "weights")):
        blob = repo / "blobs" / name.replace("/", "_")
        blob.write_text(text)
        os.symlink(os.path.relpath(blob, (snap / name).parent), snap / name)
    return snap


def download(tmp_path: Path, lib: Path, token: str = "") -> subprocess.CompletedProcess:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(lib), "HOME": str(tmp_path)}
    return subprocess.run([NODE_PY, "-c", program("hub_download.py"), "org/tiny", DEST], input=token,
                          capture_output=True, text=True, timeout=60, env=env, cwd=work)


def test_the_snapshot_becomes_hard_links_in_the_workdir_and_the_token_comes_from_stdin(tmp_path):
    snap = snapshot(tmp_path)
    lib = fake_hub(tmp_path, f"""
def snapshot_download(repo, token=None):
    open({str(tmp_path / 'asked')!r}, "w").write(repo + " " + repr(token))
    return {str(snap)!r}
""")
    r = download(tmp_path, lib, token="hf_secret\n")
    assert r.returncode == 0, r.stderr
    dest = tmp_path / "work" / DEST
    assert json.loads(r.stdout.splitlines()[-1]) == {"path": str(dest), "source": str(snap), "linked": 2, "copied": 0}
    assert (tmp_path / "asked").read_text() == "org/tiny 'hf_secret'"
    assert (dest / "sub" / "w.bin").read_text() == "weights" and not (dest / "sub" / "w.bin").is_symlink()
    assert (dest / "config.json").stat().st_ino == (snap / "config.json").resolve().stat().st_ino
    assert not Path(str(dest) + ".partial").exists()
    again = download(tmp_path, fake_hub(tmp_path / "never", "raise RuntimeError('not imported again')"))
    assert again.returncode == 0 and json.loads(again.stdout) == {"path": str(dest), "already": True}


@pytest.mark.parametrize("body, rc, said", [
    ("raise ImportError('no module')", 3, "huggingface_hub is not installed for "),
    ("def snapshot_download(repo, token=None):\n    raise OSError('offline\\nand more')", 4, "OSError: offline"),
])
def test_no_library_or_a_failed_download_exits_with_its_reason(tmp_path, body, rc, said):
    r = download(tmp_path, fake_hub(tmp_path, body))
    assert r.returncode == rc and r.stderr.strip().startswith(said) and r.stdout == ""
    assert "and more" not in r.stderr  # the first line of the error only
    assert not (tmp_path / "work" / DEST).exists()


def test_a_model_folder_in_the_workdir_spelled_like_a_hub_id_is_taken_as_it_is(tmp_path):
    """`model: org/tiny` where the master's workdir holds org/tiny/config.json: the worker loads that folder
    (training.model.pretrained), so the master downloads nothing and the hub is never asked."""
    lib = fake_hub(tmp_path, f"""
def snapshot_download(repo, token=None):
    open({str(tmp_path / 'asked')!r}, "w").write(repo)
    raise RuntimeError("the hub was asked")
""")
    local = tmp_path / "work" / "org" / "tiny"
    local.mkdir(parents=True)
    (local / "config.json").write_text("{}")
    r = download(tmp_path, lib)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == {"path": str(local), "already": True, "local": True}
    assert not (tmp_path / "asked").exists() and not (tmp_path / "work" / DEST).exists()
    (local / "config.json").unlink()  # a folder without a model is no model: the hub is asked
    r = download(tmp_path, lib)
    assert r.returncode == 4 and "the hub was asked" in r.stderr
