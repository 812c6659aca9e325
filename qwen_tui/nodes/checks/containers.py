"""A node's container runtime, for a preset that runs each node's job in a container (preset.container): the
checks before launch, and the removal of a run's container once its job is stopped (`remove`).

The checks:

- the runtime is on the node and the image is there (never pulled: a missing image is named with the command
  that puts it there), one command per node (`look`);
- the probe runs inside the image with the run's own flags and mounts (`probe_prefix`), so the versions, the
  limits and the paths it reports are the ones the run will have; an image that lacks the worker's packages
  (torch, qwen-tui's worker) is named (`image_findings`), and a container that does not start is named with
  what the runtime said and what usually fixes it (`start_failure`).

Findings land in the matrix's "container" column.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field

from qwen_tui import __version__
from qwen_tui.cluster.facts import NodeFacts
from qwen_tui.nodes.checks.findings import ERROR, INFO, WARNING, Finding
from qwen_tui.nodes.results import on_nodes
from qwen_tui.nodes.transport.protocol import Transport
from qwen_tui.plan.container import container_name, removal_argv, run_mounts, runtime_prefix
from qwen_tui.preset.schema import Container, Preset

COLUMN = "container"
RUNTIME_FIX = {
    "podman": "apt-get install podman runc (dnf install podman on RHEL and Fedora)",
    "docker": "install Docker Engine (https://docs.docker.com/engine/install/) and start dockerd",
    "apptainer": "install Apptainer (https://apptainer.org/docs/admin/main/installation.html)",
    "enroot": "install enroot (https://github.com/NVIDIA/enroot/releases)",
    "pyxis": "install enroot and pyxis on the nodes and load pyxis in SLURM's plugstack.conf "
             "(https://github.com/NVIDIA/pyxis/wiki/Setup)",
}
# A URI the runtime pulls itself: nothing on the node to look at before the run.
_URI = re.compile(r"^[a-z][a-z0-9+.-]*://")
# The tools the checks run on the node itself, not in the image (iperf3 measures the node's links; ssh and
# ssh-keygen set up keys): each one missing is a line "no-tool NAME".
HOST_TOOLS = ("iperf3", "ssh", "ssh-keygen")
# Names the node's missing tools, then runs the image check where the runtime is there (exit 127 without): on the
# PATH, or for pyxis, srun's own options (a SPANK plugin adds them to srun's help where plugstack.conf loads it).
_WITH_RUNTIME = ('for t in ' + " ".join(HOST_TOOLS) + '; do command -v "$t" >/dev/null 2>&1 || echo "no-tool $t"; '
                 'done; if [ "$1" = pyxis ]; then srun --help 2>/dev/null | grep -q -e --container-image || exit 127; '
                 'else command -v "$1" >/dev/null 2>&1 || exit 127; fi; shift; exec "$@"')
_ENROOT_HAS = 'enroot list | grep -qxF -- "$1"'


def _is_path(image: str) -> bool:
    return image.startswith(("/", ".")) or image.endswith((".sif", ".sqsh", ".squashfs"))


def image_argv(c: Container) -> list[str] | None:
    """The command that exits 0 when the image is on the node, 1 when it is not; None when it cannot be told
    without pulling (an apptainer URI)."""
    if c.runtime == "podman":
        return ["podman", "image", "exists", c.image]
    if c.runtime == "docker":
        return ["docker", "image", "inspect", "--format", "{{.Id}}", c.image]
    if _is_path(c.image):
        return ["test", "-e", c.image]
    if c.runtime == "apptainer":
        return None if _URI.match(c.image) else ["test", "-e", c.image]
    if c.runtime == "pyxis":
        return None  # an image it imports from a registry when the step starts
    return ["sh", "-c", _ENROOT_HAS, "sh", c.image]


def image_fix(c: Container, label: str) -> str:
    if c.runtime == "podman":
        return (f"copy it from a node that has it: podman save {c.image} | ssh {label} podman load; or build it "
                "there: containers/build-image.sh --tag " + c.image)
    if c.runtime == "docker":
        return f"copy it from a node that has it: docker save {c.image} | ssh {label} docker load"
    if c.runtime == "apptainer":
        return f"put the .sif at {c.image} on {label} (shared storage, or scp), or build it there: apptainer build"
    if c.runtime == "pyxis":
        return (f"put the .sqsh at {c.image} on {label} (shared storage), or make it there: enroot import -o "
                f"{c.image} docker://IMAGE (podman://IMAGE from a local podman)")
    return f"put the .sqsh at {c.image} on {label}, or create the container there: enroot create --name {c.image}"


@dataclass
class Look:
    """What one node has of the container runtime and the image."""

    verdict: str  # ok | no-runtime | no-image | unchecked | error
    detail: str = ""
    missing_tools: list[str] = field(default_factory=list)  # of HOST_TOOLS, on the node itself


def look(t: Transport, c: Container, *, timeout: float = 60.0) -> Look:
    check = image_argv(c) or ["true"]
    r = t.run(["sh", "-c", _WITH_RUNTIME, "sh", c.runtime, *check], timeout=timeout)
    lines = r.stdout.splitlines()
    missing = [ln.split(" ", 1)[1] for ln in lines if ln.startswith("no-tool ")]
    out = "\n".join(ln for ln in lines if not ln.startswith("no-tool ")).strip()
    err = (r.stderr.strip() or out)[-300:]
    if r.rc == 127:
        return Look("no-runtime", "", missing)
    if image_argv(c) is None:
        return Look("unchecked", f"{c.image} is a URI: {c.runtime} fetches it when the job starts" if
                    c.runtime != "pyxis" else f"{c.image}: pyxis imports it when each step starts", missing)
    if r.rc == 0:
        return Look("ok", out, missing)
    if c.runtime == "docker" and "no such image" not in err.lower():
        return Look("error", err, missing)  # the daemon does not answer, or this user may not use it
    if r.rc == 1:
        return Look("no-image", "", missing)
    return Look("error", f"{' '.join(check[:3])} exited {r.rc}: {err}", missing)


def precheck(preset: Preset, transports: dict[int, Transport]) -> tuple[list[Finding], set[int], dict[int, list[str]]]:
    """(findings, the nodes where the job cannot run: no runtime or no image, each node's missing HOST_TOOLS).
    Runs on every node at once."""
    c = preset.container
    assert c is not None
    nodes = preset.cluster.nodes
    res = on_nodes(lambda i: look(transports[i], c), sorted(transports), timeout=90,
                   labels={i: n.label for i, n in enumerate(nodes)})
    out, blocked, tools = [], set(), {}
    for i, v in sorted(res.items()):
        lab = nodes[i].label
        if isinstance(v, BaseException):
            out.append(Finding(ERROR, "CONTAINER_CHECK_FAILED", f"{lab}: cannot look for {c.runtime} and the image: "
                               f"{v}", "", i, COLUMN))
            blocked.add(i)
            continue
        verdict, detail = v.verdict, v.detail
        tools[i] = v.missing_tools
        if verdict == "no-runtime":
            out.append(Finding(ERROR, "CONTAINER_RUNTIME_MISSING", f"{lab}: srun there has no --container-image: "
                               "pyxis is not loaded; container.runtime is pyxis" if c.runtime == "pyxis" else
                               f"{lab}: {c.runtime} is not installed (not on the PATH of a login over SSH); "
                               f"container.runtime is {c.runtime}",
                               RUNTIME_FIX[c.runtime] + ", or set container.runtime to the one the nodes have",
                               i, COLUMN))
            blocked.add(i)
        elif verdict == "no-image":
            out.append(Finding(ERROR, "CONTAINER_IMAGE_MISSING", f"{lab}: the image {c.image} is not on the node "
                               f"({c.runtime} never pulls it for qwen-tui)", image_fix(c, lab), i, COLUMN))
            blocked.add(i)
        elif verdict == "error":
            out.append(Finding(ERROR, "CONTAINER_CHECK_FAILED", f"{lab}: {c.runtime} could not tell whether "
                               f"{c.image} is there: {detail}",
                               "run the command on the node by hand: is the daemon running, may this user use "
                               "it?", i, COLUMN))
            blocked.add(i)
        elif verdict == "unchecked":
            out.append(Finding(INFO, "CONTAINER_IMAGE_UNCHECKED", f"{lab}: {detail}", "", i, COLUMN))
    return out, blocked, tools


def probe_prefix(preset: Preset, index: int, workdir: str) -> list[str]:
    """The runtime's command the probe runs after on node `index`: the run's own flags and mounts (the GPUs
    where the run wants them), a name of its own. The directories the run will mount are created as the launch
    creates them. No variable is passed in but container.pass_env's, from the node's login environment (the
    probe reads the preset's cache variables from its arguments)."""
    c = preset.container
    assert c is not None
    mounts, make = run_mounts(preset, workdir, workdir, {**preset.network.env, **c.env})
    return runtime_prefix(c, name=container_name(f"probe-{uuid.uuid4().hex[:8]}", index), workdir=workdir,
                          mounts=mounts, env=c.pass_env, gpus=preset.training.device != "cpu",
                          infiniband=False, make_dirs=make, node=preset.cluster.nodes[index].host)


def start_failure(preset: Preset, index: int, rc: int, err: str) -> Finding:
    """The probe's container did not start (the runtime's own exit codes: 125, 126, 127): why, and the fix."""
    c = preset.container
    assert c is not None
    lab = preset.cluster.nodes[index].label
    said = err.strip()[-400:]
    low = said.lower()
    if "rlimit" in low or "ulimit" in low:
        fix = ("the runtime may not raise the limits past the node's hard ones (rootless, or root without "
               "CAP_SYS_RESOURCE): raise them in /etc/security/limits.conf, or keep the node's own limit with "
               "container.ulimits: {memlock: host}")
    elif "nvidia.com/gpu" in low or "cdi" in low:
        fix = ("generate the node's CDI spec: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml (NVIDIA "
               "Container Toolkit), or set training.device: cpu")
    elif "could not select device driver" in low or ("gpu" in low and c.runtime == "docker"):
        fix = "install the NVIDIA Container Toolkit and restart dockerd, or set training.device: cpu"
    elif "container-image" in low and ("unrecognized" in low or "unknown" in low):
        fix = RUNTIME_FIX["pyxis"]
    elif rc == 127 or "executable file not found" in low:
        fix = f"the image has no {c.python}: set container.python to the image's Python"
    else:
        fix = "run the command of `qwen-tui replay --dry-run` on the node by hand to see the runtime's words"
    return Finding(ERROR, "CONTAINER_START_FAILED", f"{lab}: the container did not start under {c.runtime} "
                   f"(exit {rc}): {said}", fix, index, COLUMN)


def remove(t: Transport, prefix: list[str], *, timeout: float = 60.0) -> str | None:
    """Remove the container `prefix` (a NodeCommand's container) names on the node, once its job is stopped:
    None when none is left, else what the runtime said."""
    argv = removal_argv(prefix)
    if argv is None:
        return None
    r = t.run(argv, timeout=timeout)
    err = (r.stderr or r.stdout).strip()
    if r.rc == 0 or "no such container" in err.lower():  # docker has no --ignore
        return None
    return f"{' '.join(argv[:2])} {argv[-1]} exited {r.rc}: {err[-300:]}"


WORKER_PACKAGES = ("torch", "transformers", "peft", "accelerate")


def image_findings(preset: Preset, index: int, f: NodeFacts) -> list[Finding]:
    """What the probe found inside the image: the worker's packages, or what lacks; which qwen-tui it holds."""
    c = preset.container
    assert c is not None
    lab = preset.cluster.nodes[index].label
    missing = [p for p in WORKER_PACKAGES if not f.versions.get(p)]
    if not f.training_importable:
        missing.append("qwen-tui's worker (the training package)")
    if missing:
        return [Finding(ERROR, "IMAGE_LACKS_WORKER", f"{lab}: the image {c.image} lacks {', '.join(missing)} "
                        f"for {c.python}", "build the image with qwen-tui's wheel and its train extra: "
                        "containers/build-image.sh (docs/containers.md), or pip install 'qwen-tui[train]' in it",
                        index, COLUMN)]
    theirs = f.versions.get("qwen-tui")
    worker = f"qwen-tui {theirs}" if theirs else "the worker from the workdir"
    out = [Finding(INFO, "CONTAINER", f"{lab}: {c.runtime}, image {c.image}: {worker}, torch {f.versions['torch']}, "
                   f"transformers {f.versions['transformers']}, Python {f.python_version}", "", index, COLUMN)]
    if theirs and theirs != __version__:
        out.append(Finding(WARNING, "IMAGE_WORKER_VERSION", f"{lab}: the image's worker is qwen-tui {theirs}, this "
                           f"qwen-tui is {__version__}", "rebuild the image from this version: "
                           "containers/build-image.sh", index, COLUMN))
    return out
