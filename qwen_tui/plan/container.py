"""Each node's job inside a container: the runtime's run command that a node's argv runs after. Pure.

`wrap(container, argv, ...)` is the whole command; `runtime_prefix` is the part before the argv, which the
plan keeps beside the argv (NodeCommand.container), so that whatever reads the worker's flags or its Python
from the argv reads the same thing with or without a container. The flags multi-node training needs are set
here, never left to the user, each for a reason (docs/containers.md lists them):

- host network (`--network host`): torchrun's rendezvous, NCCL's and gloo's sockets bind the node's own
  interfaces and ports, the ones the checks measured; a bridge network would hide them behind NAT;
- the host's PID namespace (`--pid host`): the ranks keep the node's pids, which their heartbeats report, so
  qwen-tui's stop, its stack collection (SIGUSR1, py-spy) and its straggler evidence reach them;
- the host's IPC namespace (`--ipc host`): NCCL's shared-memory transport and the DataLoader workers use
  /dev/shm, which is 64 MB in a container of its own;
- the host's UTS namespace (`--uts host`): the node's hostname, which NCCL tells nodes apart by and the checks
  name the node by;
- `--ulimit memlock=-1:-1`: NCCL pins host memory for GPU and RDMA transfers (`container.ulimits` may keep the
  node's own limit where the runtime cannot raise it);
- the GPUs (`--device nvidia.com/gpu=all` through CDI for podman, `--gpus all` for docker, `--nv` for
  Apptainer, NVIDIA_VISIBLE_DEVICES for enroot's hook) unless the run is on CPU or the node has none;
- /dev/infiniband and IPC_LOCK (the verbs library pins memory) where the node's HCAs are in use
  (MELLANOX_VISIBLE_DEVICES for enroot's hook; Apptainer shares the node's /dev);
- `--security-opt label=disable`: on an SELinux node the mounted directories and devices are otherwise denied;
- the workdir, the run directory and the run's own paths (data, model, output, caches) mounted at the same
  path, so every path in the argv means the same inside and out; the container starts in the workdir;
- the job's environment passed by name only (`--env NAME`): the values (secrets among them) stay in the
  environment the runtime starts in and never appear in an argv, a log or a file;
- the container named after the run and node (`qwen-tui-<run>-node<rank>`), removed when it ends (`--rm`;
  podman `--replace`s a leftover of an earlier attempt), and never pulled (`--pull never`): a missing image
  fails at once, and the checks name it before launch.

pyxis is not a command but srun's own options (a SLURM plugin that runs each task in an enroot container): its
prefix is a job step of its own on the node, started from where the node's command runs (a step of the
allocation already, so SLURM_JOB_ID is set): `srun --overlap --whole` on that node, one task, with
`--container-image`, the mounts, the workdir and `--container-env` naming the job's variables (pyxis sets the
step's environment in the container, but an image's own value wins unless named there). enroot shares the node's
network, PID and IPC namespaces; the GPUs and HCAs reach the container through enroot's hooks, by the variables
set before the step (the step gets every GPU of the node the job holds: `--whole`). Unnamed, pyxis's container
is removed when its task ends.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..preset.schema import Container, Preset

# The marks every process of a job carries (nodes/jobs.py's RUN_MARK and JOB_MARK, which set them): passed in by
# name so that the ranks inside the container carry them too, and qwen-tui's stop finds them.
JOB_MARKS = ("QWEN_TUI_RUN_ID", "QWEN_TUI_JOB_PGID")
# Variables that describe the node, not the image: never passed in.
_HOST_ONLY = {"PATH", "HOME"}
# Caches the worker and its libraries read and write, mounted where the run's environment points them.
CACHE_VARS = ("QWEN_TUI_CACHE", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE",
              "XDG_CACHE_HOME", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR")
# Directories a mount must never cover: the image's own system.
_SYSTEM = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr",
           "/var", "/tmp")
# Creates the directories given before `--` (a bind mount needs its source to exist), then runs the rest.
MKDIRS = 'while [ "$1" != -- ]; do mkdir -p -- "$1" || exit 125; shift; done; shift; exec "$@"'
# enroot has no working-directory flag: the command starts there itself.
_IN_DIR = 'cd -- "$1" || exit 125; shift; exec "$@"'


@dataclass(frozen=True)
class Mount:
    src: str  # on the node
    dst: str  # in the container
    ro: bool = False

    def spec(self) -> str:
        return f"{self.src}:{self.dst}" + (":ro" if self.ro else "")


def container_name(run_id: str, rank: int) -> str:
    """`qwen-tui-<run>-node<rank>`, in the characters podman and docker allow in a name."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)
    return f"qwen-tui-{safe}-node{rank}"


def parse_mount(text: str) -> Mount:
    """A preset's `container.mounts` entry (validated by the schema): HOST[:CONTAINER][:ro|rw]."""
    parts = text.split(":")
    ro = parts[-1] == "ro"
    if parts[-1] in ("ro", "rw"):
        parts = parts[:-1]
    return Mount(parts[0], parts[1] if len(parts) > 1 else parts[0], ro)


def _under(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def run_mounts(preset: Preset, workdir: str, run_dir: str, env: dict[str, str]) -> tuple[list[Mount], list[str]]:
    """(the mounts of a node's job, the directories to create before they are mounted). Everything at the same
    path inside: the workdir, the run directory, the run's absolute paths (a file's directory for what is read,
    the directory itself for what is written), the caches `env` points at, then the preset's own mounts.
    Relative paths lie under the workdir; a path under one already mounted needs no mount of its own."""
    t = preset.training
    reads = [t.data, t.eval_data, t.model, t.resume_from_checkpoint]
    writes = [t.output_dir, t.tokenized_cache_dir if t.tokenized_cache_dir != "none" else None]
    writes += [env.get(k) for k in CACHE_VARS]
    want: list[tuple[str, bool]] = [(workdir, False), (run_dir, False)]  # (path, create first)
    for p in reads:
        if p and posixpath.isabs(p):
            d = posixpath.dirname(posixpath.normpath(p))
            want.append((d if d not in _SYSTEM else posixpath.normpath(p), False))
    for p in writes:
        if p and posixpath.isabs(p):
            want.append((posixpath.normpath(p), True))
    own = [parse_mount(m) for m in preset.container.mounts] if preset.container else []
    keep: dict[str, bool] = {m.src: False for m in own if m.src == m.dst}  # path -> create it first
    # shorter paths first: a path under one kept already (the preset's own mounts included) needs no mount
    for path, create in sorted(set(want), key=lambda x: (len(x[0]), x[0])):
        if posixpath.isabs(path) and path not in _SYSTEM and not any(_under(path, k) for k in keep):
            keep[path] = create
    seen: set[str] = set()
    mounts = []
    for path, _ in want:  # in the order above: the workdir first
        if path in keep and path not in seen:
            seen.add(path)
            mounts.append(Mount(path, path))
    return mounts + [m for m in own if m not in mounts], [m.src for m in mounts if keep[m.src]]


def env_names(env: Iterable[str], container: Container) -> list[str]:
    """The variables the container gets, by name: the job's own (its environment, the marks, the preset's
    container.env, all set where the runtime starts) and container.pass_env (the node's own values)."""
    names: list[str] = []
    for k in [*env, *JOB_MARKS, *container.pass_env]:
        if k not in names and k not in _HOST_ONLY:
            names.append(k)
    return names


def _ulimits(container: Container) -> list[str]:
    limits = {"memlock": "-1:-1", **container.ulimits}
    return [x for k, v in limits.items() if v != "host" for x in ("--ulimit", f"{k}={v}")]


# enroot's hooks read these: which GPUs and HCAs to put in the container (set literally, the node's own values
# are not the container's business).
_GPU_VARS = ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility")
_HCA_VARS = ("MELLANOX_VISIBLE_DEVICES=all",)


def _pyxis(c: Container, *, name: str, node: str | None, workdir: str, mounts: list[Mount], env: list[str],
           gpus: bool, infiniband: bool) -> list[str]:
    hooks = [*(_GPU_VARS if gpus else ()), *(_HCA_VARS if infiniband else ())]
    names = [*env, *(v.split("=", 1)[0] for v in hooks)]
    argv = ["env", *hooks] if hooks else []
    argv += ["srun", "--overlap", "--whole", "--nodes", "1", "--ntasks", "1"]
    if node:
        argv += ["--nodelist", node]  # else SLURM picks the allocation's first node, not this one
    argv += ["--kill-on-bad-exit=1", "--unbuffered", "--quiet", "--job-name", name,
             f"--container-image={c.image}", f"--container-workdir={workdir}"]
    if mounts:
        argv.append("--container-mounts=" + ",".join(m.spec() for m in mounts))
    if names:
        argv.append("--container-env=" + ",".join(names))
    return [*argv, *c.extra_args]


def runtime_prefix(container: Container, *, name: str, workdir: str, mounts: list[Mount], env: list[str],
                   gpus: bool, infiniband: bool, make_dirs: list[str] | None = None,
                   node: str | None = None) -> list[str]:
    """The runtime's command up to the image (and, for enroot, the step into the workdir): what a node's argv
    runs after. `env`: the variable names to pass in (env_names); `gpus`, `infiniband`: whether to hand the
    node's GPUs and HCAs to the container; `make_dirs`: directories to create on the node first; `node`: the
    node's SLURM name (pyxis's step is started on it)."""
    c = container
    if c.runtime in ("podman", "docker"):
        argv = [c.runtime, "run", "--rm", "--name", name, "--pull", "never"]
        if c.runtime == "podman":
            argv.append("--replace")
        argv += ["--network", "host", "--pid", "host", "--ipc", "host", "--uts", "host", *_ulimits(c),
                 "--security-opt", "label=disable"]
        if gpus:
            argv += ["--device", "nvidia.com/gpu=all"] if c.runtime == "podman" else ["--gpus", "all"]
        if infiniband:
            argv += ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK"]
        for m in mounts:
            argv += ["--volume", m.spec()]
        argv += ["--workdir", workdir]
        for k in env:
            argv += ["--env", k]
        argv += [*c.extra_args, c.image]
    elif c.runtime == "apptainer":
        # Apptainer shares the node's network, PID and IPC namespaces and /dev, and passes the environment in
        argv = ["apptainer", "exec"]
        if gpus:
            argv.append("--nv")
        for m in mounts:
            argv += ["--bind", m.spec()]
        argv += ["--pwd", workdir, *c.extra_args, c.image]
    elif c.runtime == "pyxis":
        argv = _pyxis(c, name=name, node=node, workdir=workdir, mounts=mounts, env=env, gpus=gpus,
                      infiniband=infiniband)
    else:  # enroot: the node's namespaces too; its hooks add the GPUs and HCAs the variables name
        argv = ["enroot", "start"]
        for v in [*(_GPU_VARS if gpus else ()), *(_HCA_VARS if infiniband else ())]:
            argv += ["--env", v]
        for m in mounts:
            # an fstab line, colon-separated: source, target, type, options
            argv += ["--mount", f"{m.src}:{m.dst}:none:x-create=auto,rbind" + (",ro" if m.ro else "")]
        for k in env:
            argv += ["--env", k]
        argv += [*c.extra_args, c.image, "sh", "-c", _IN_DIR, "sh", workdir]
    if make_dirs:
        argv = ["sh", "-c", MKDIRS, "sh", *make_dirs, "--", *argv]
    return argv


# Each runtime's run command, as two words of a prefix (pyxis's: its step's srun).
_RUN_WORDS = (("podman", "run"), ("docker", "run"), ("enroot", "start"), ("srun", "--overlap"))


def _insert(prefix: list[str], flags: dict[str, list[str]]) -> list[str]:
    """`prefix` with the flags for its runtime (runtime -> flags) right after its run command."""
    for i, a in enumerate(prefix[:-1]):
        if (a, prefix[i + 1]) in _RUN_WORDS:
            return [*prefix[:i + 2], *flags.get(a, []), *prefix[i + 2:]]
    return list(prefix)


def with_env(prefix: list[str], names: Iterable[str]) -> list[str]:
    """A runtime_prefix that passes `names` in as well (by name): for a job that adds variables of its own to the
    plan's environment. Apptainer passes the whole environment in already; srun passes it to pyxis, whose
    --container-env (it may be given again) makes these values win over the image's."""
    names = list(names)
    extra = [x for n in names for x in ("--env", n)]
    pyxis = ["--container-env=" + ",".join(names)] if names else []
    return _insert(prefix, {"podman": extra, "docker": extra, "enroot": extra, "srun": pyxis})


def with_stdin(prefix: list[str]) -> list[str]:
    """A runtime_prefix whose command reads its standard input (podman and docker keep it closed unless asked;
    Apptainer and enroot pass it on)."""
    return _insert(prefix, {"podman": ["--interactive"], "docker": ["--interactive"]})


def removal_argv(prefix: list[str]) -> list[str] | None:
    """The command that removes the container a runtime_prefix names, whatever state it is in (a stop that had to
    kill the runtime's client can leave it behind), or None where the runtime keeps no container (Apptainer,
    enroot, pyxis's unnamed one) or the prefix names none."""
    for i, a in enumerate(prefix[:-1]):
        if (a, prefix[i + 1]) in (("podman", "run"), ("docker", "run")) and "--name" in prefix[i:]:
            name = prefix[prefix.index("--name", i) + 1]
            return [a, "rm", "--force", "--ignore", name] if a == "podman" else [a, "rm", "--force", name]
    return None


def wrap(container: Container, argv: list[str], *, name: str, workdir: str, env: Iterable[str] = (),
         mounts: list[Mount] | None = None, make_dirs: list[str] | None = None, gpus: bool = True,
         infiniband: bool = False, node: str | None = None) -> list[str]:
    """`argv` run inside `container`: the node's whole command (for an srun step, or any launcher that starts
    the command itself). `env`: the names of the variables it must see, set in the environment the command
    starts in (they are passed by name, with the run's marks); `mounts`: default the workdir alone."""
    mounts = [Mount(workdir, workdir)] if mounts is None else mounts
    prefix = runtime_prefix(container, name=name, workdir=workdir, mounts=mounts, env=env_names(env, container),
                            gpus=gpus, infiniband=infiniband, make_dirs=make_dirs, node=node)
    return [*prefix, *argv]
