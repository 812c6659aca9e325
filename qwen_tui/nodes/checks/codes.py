"""Every code a node check reports (a Finding of `qwen-tui check`, the wizard's Nodes and Network steps, replay's
checks), what raises it and what fixes it, in the order the checks run. The manual's reference is generated from
this table (docs/gen_reference.py); tests/unit/test_reference.py fails when a check reports a code that has no
entry here, or an entry no check reports. The message of each finding names the node and carries its figures."""

from __future__ import annotations

from ...base.levels import CodeDoc

CHECKS: dict[str, CodeDoc] = {
    # ssh: reaching every node
    "UNREACHABLE": CodeDoc(
        "error",
        "a node (or a ProxyJump hop) did not connect within `cluster.connect_timeout`: refused, timed out, "
        "authentication failed, or its host key is unknown (refused unless accepted) or changed (always refused)",
        "by cause: `qwen-tui keys PRESET` for authentication; verify an unknown key's fingerprint, then "
        "`--accept-new-host-keys`; find out why a key changed before removing the old known_hosts entry; else check "
        "the host name, port and that sshd runs (`ssh -v HOST`)"),
    # container: the runtime and the image, where the preset runs each node's job in one (docs/containers.md)
    "CONTAINER_RUNTIME_MISSING": CodeDoc(
        "error",
        "`container.runtime` (podman, docker, apptainer, enroot) is not on the PATH of a login to the node; for "
        "pyxis, the node's srun has no `--container-image` (the plugin is not loaded)",
        "install it there (pyxis: with enroot, loaded in SLURM's plugstack.conf), or set `container.runtime` to "
        "the one the nodes have"),
    "CONTAINER_IMAGE_MISSING": CodeDoc(
        "error",
        "`container.image` is not on the node (qwen-tui never pulls it)",
        "copy it from a node that has it (`podman save IMAGE | ssh NODE podman load`; a `.sif` or `.sqsh` file to "
        "its path), or build it there: `containers/build-image.sh`"),
    "CONTAINER_CHECK_FAILED": CodeDoc(
        "error",
        "the runtime could not say whether the image is there (docker's daemon does not answer, this user may not "
        "use it), or the node did not answer",
        "run the runtime's image command on the node by hand; start the daemon, or add the user to its group"),
    "CONTAINER_IMAGE_UNCHECKED": CodeDoc(
        "info",
        "the image is a URI (`docker://...` for Apptainer): the runtime fetches it when the job starts, so there is "
        "nothing on the node to look at before"),
    "CONTAINER_START_FAILED": CodeDoc(
        "error",
        "the probe's container did not start with the run's flags: limits the runtime may not raise, no CDI spec "
        "for the GPUs, no such Python in the image; the message carries the runtime's words",
        "by cause: raise the node's hard limits or `container.ulimits: {memlock: host}`; `nvidia-ctk cdi generate "
        "--output=/etc/cdi/nvidia.yaml`; `container.python`"),
    "IMAGE_LACKS_WORKER": CodeDoc(
        "error",
        "the image's Python lacks torch, transformers, peft, accelerate or qwen-tui's worker (the probe ran inside "
        "it)",
        "build the image with qwen-tui's wheel and its train extra: `containers/build-image.sh`"),
    "IMAGE_WORKER_VERSION": CodeDoc(
        "warning",
        "the image's qwen-tui is another version than the one that launches",
        "rebuild the image from this version: `containers/build-image.sh`"),
    "CONTAINER": CodeDoc(
        "info",
        "what the image holds, one line a node: the runtime, qwen-tui, torch, transformers and Python it trains with"),
    # python: the node's interpreter and its stack
    "PYTHON_MISSING": CodeDoc(
        "error",
        "the node's Python (`cluster.nodes[i].python`) does not run",
        "install Python 3.10+ on the node, or set `cluster.nodes[i].python` to its path"),
    "WORKDIR_MISSING": CodeDoc(
        "error",
        "the node's `workdir` does not exist",
        "create it, or sync the code: `qwen-tui check --sync`"),
    "PROBE_FAILED": CodeDoc(
        "error",
        "the probe (a standard-library Python program sent over SSH) failed on the node, or the node's checks could "
        "not run; the message says how",
        "the message's cause; `qwen-tui -vv check PRESET` logs the exchange"),
    "TORCH_MISSING": CodeDoc(
        "error",
        "torch does not import in the node's Python",
        "`PYTHON -m pip install torch` on the node (torchrun comes with it)"),
    "TORCHRUN_MISSING": CodeDoc(
        "warning",
        "no `torchrun` script next to the node's Python; qwen-tui runs `python -m torch.distributed.run`, which is "
        "enough",
        "nothing for qwen-tui; a hand-written command wants `python -m torch.distributed.run`"),
    "VERSION_MISMATCH": CodeDoc(
        "error / warning",
        "a package differs from the master's: torch is an error; transformers, peft, deepspeed, accelerate a warning",
        "`PYTHON -m pip install PACKAGE==VERSION` with the master's version"),
    "PYTHON_MISMATCH": CodeDoc(
        "warning",
        "the node's Python minor version differs from the master's",
        "the same Python on every node (a shared virtual environment, or one image)"),
    # gpu
    "GPU_QUERY_FAILED": CodeDoc(
        "error / warning",
        "`nvidia-smi` failed on the node (an error when the run wants GPUs)",
        "check the driver with `nvidia-smi` on the node"),
    "CPU_ONLY": CodeDoc(
        "warning / info",
        "the node has no GPU (a warning when the run wants GPUs)",
        "install the NVIDIA driver, or set `training.device: cpu`"),
    "TOO_FEW_GPUS": CodeDoc(
        "error",
        "the node has fewer GPUs than `cluster.nodes[i].gpus` processes",
        "set `cluster.nodes[i].gpus` to the count found"),
    "GPUS": CodeDoc(
        "info",
        "the node's GPUs: count, model and memory"),
    "GPU_MODEL_MISMATCH": CodeDoc(
        "warning",
        "the node's GPU model differs from the master's: every rank runs at the slowest's pace",
        "the same GPU model on every node"),
    "GPU_COUNT_MISMATCH": CodeDoc(
        "warning",
        "the node has another GPU count than the master",
        "the same count on every node"),
    "GPU_TOPOLOGY": CodeDoc(
        "info",
        "how the node's GPUs are joined (`nvidia-smi topo -m`, and `topo -p2p r`/`w` where the driver answers, 15 s "
        "each) and the bus it gives NCCL, in one line (\"8 GPUs, NVSwitch (NV18), 2 NUMA nodes; bus ~360 GB/s\"); "
        "or that it could not be read"),
    "P2P_PCIE": CodeDoc(
        "warning",
        "GeForce/TITAN/RTX cards joined over PCIe only run 2 or more ranks on the node: NCCL's peer-to-peer hangs the "
        "first collective there, whatever the driver says",
        "`network.env` `NCCL_P2P_LEVEL: NVL` (P2P over NVLink only; the wizard's F8 applies it)"),
    "P2P_UNSUPPORTED": CodeDoc(
        "info",
        "other GPUs on PCIe whose driver reports no peer-to-peer: NCCL goes through host memory there, slower, no "
        "hang"),
    # code, data, model
    "CODE_MISSING": CodeDoc(
        "error",
        "the worker (`training`) does not import in the node's workdir",
        "copy the project there: `qwen-tui check --sync`"),
    "DATA_MISSING": CodeDoc(
        "error",
        "`training.data` (or `training.eval_data`, or a file of `training.datasets`: a path, a dataset_info.json or "
        "the file its entry names) is missing on the node",
        "`qwen-tui check --sync` copies it from the master; if the master lacks it too, put it there or correct "
        "`training.data`"),
    "DATA_DIFFERS": CodeDoc(
        "error",
        "the node's copy of `training.data` (or of another of the run's data files) differs from the master's "
        "(sha256)",
        "`qwen-tui check --sync --overwrite` replaces it with the master's"),
    "MODEL_MISSING": CodeDoc(
        "error",
        "`training.model` (a local directory, or a hub id in no cache of the node) is missing on the node",
        "`qwen-tui check --sync` copies it from the master (downloading a hub id there once); if the master lacks "
        "it too, put it there or correct `training.model`"),
    "MODEL_DIFFERS": CodeDoc(
        "error",
        "the node's copy of the model differs from the master's (sha256 of every file)",
        "`qwen-tui check --sync --overwrite` replaces it with the master's"),
    "MODEL_DOWNLOAD_FAILED": CodeDoc(
        "error",
        "`check --sync` could not download the hub model on the master",
        "check `HF_ENDPOINT` / `HF_TOKEN` (`network.env`), or set `HF_HUB_OFFLINE=1` with the model in the "
        "master's hub cache"),
    # disk and limits
    "LOW_DISK": CodeDoc(
        "warning",
        "under 20 GiB free where `training.output_dir` lives",
        "free space, or point `training.output_dir` elsewhere"),
    "OUTPUT_NO_ROOM": CodeDoc(
        "error",
        "the node's disk cannot hold what it will keep (weights, its optimizer shards, `save_total_limit` + 1 "
        "checkpoints, the final and merged model), estimated from the model's shape",
        "free space, lower `training.save_total_limit`, or point `training.output_dir` at a larger disk"),
    "OUTPUT_PLACE": CodeDoc(
        "info",
        "where the node keeps the checkpoints and the final model (one copy on shared storage, each node's own "
        "without), and the room needed against the room free"),
    "SHM_SMALL": CodeDoc(
        "warning",
        "/dev/shm is under 1 GiB (Docker's default is 64 MB): NCCL's shared memory and DataLoader workers fail",
        "in a container `docker run --shm-size=16g` (or `--ipc=host`); on a host "
        "`mount -o remount,size=16G /dev/shm`"),
    "MEMLOCK_LIMITED": CodeDoc(
        "warning / info",
        "locked memory is limited (`ulimit -l`): NCCL pins memory for GPU and RDMA transfers (a note on CPU-only "
        "nodes)",
        "`ulimit -l unlimited` (limits.conf: `* - memlock unlimited`; `docker run --ulimit memlock=-1`)"),
    "OPEN_FILES_LOW": CodeDoc(
        "warning / info",
        "fewer than 4096 open files allowed (`ulimit -n`): DataLoader workers and NCCL's sockets take many",
        "`ulimit -n 65536` (limits.conf: `* - nofile 65536`)"),
    # ports and firewall
    "MASTER_PORT_IN_USE": CodeDoc(
        "error",
        "`network.master_port` is taken on the master",
        "pick another `network.master_port`, or stop what listens there (`ss -ltnp 'sport = :PORT'`)"),
    "MASTER_PORT_UNREACHABLE": CodeDoc(
        "error",
        "a node cannot connect to the master port",
        "open that TCP port from the node to the master (firewall), or pick a `network.master_port` that is open"),
    "HIGH_PORTS_BLOCKED": CodeDoc(
        "error",
        "a sample of ephemeral ports (NCCL's and gloo's own sockets), tried from every other node once every "
        "listener is bound, did not connect",
        "allow TCP between the nodes on the ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`)"),
    "PORTS_NOT_TRIED": CodeDoc(
        "info",
        "ports that were not tried because an earlier port test failed; only ports tried are reported",
        "fix the ports named above, then check again"),
    "PORT_TEST_FAILED": CodeDoc(
        "error",
        "the port test itself could not run on a node (its listener or probe failed)",
        "the message's cause; `qwen-tui -vv check PRESET` logs the exchange"),
    "FIREWALL_RULES": CodeDoc(
        "warning",
        "iptables or nft rules that drop or reject, which may block the job's ports",
        "make sure they spare the master port and the ephemeral range between the nodes"),
    "FIREWALL_UNREAD": CodeDoc(
        "warning",
        "the firewall could not be read (no iptables/nft found, or they need root): the cell says \"not checked\", "
        "never \"ok\"",
        "run the check as root, or let the login user read the rules without a password (sudoers: `USER "
        "ALL=(root) NOPASSWD: /usr/sbin/iptables -S, /usr/sbin/nft list ruleset`)"),
    # bandwidth and fabric
    "BANDWIDTH": CodeDoc(
        "info",
        "iperf3 from the node to the master, 4 parallel streams, in Gbit/s"),
    "LOW_BANDWIDTH": CodeDoc(
        "warning",
        "iperf3 from the node to the master measured under 10 Gbit/s: gradient all-reduce will be slow over this "
        "link",
        "use a faster interface (`network.interface`) or fewer nodes"),
    "BANDWIDTH_UNMEASURED": CodeDoc(
        "warning",
        "iperf3 ran but measured nothing between the node and the master",
        "the message's cause (iperf3 missing: `apt-get install iperf3`)"),
    "IPERF3_MISSING": CodeDoc(
        "warning",
        "iperf3 is not installed on the node or the master, so the bandwidth is not measured",
        "`apt-get install iperf3` (or `dnf install iperf3`)"),
    "IB_PORTS": CodeDoc(
        "info",
        "the node's InfiniBand/RoCE HCA ports: state, link layer, rate and RoCE GID index"),
    "IB_PORTS_DOWN": CodeDoc(
        "warning",
        "the node has InfiniBand/RoCE HCAs but no active port: NCCL will use sockets",
        "bring the port up (`ibstat` / `ibv_devinfo` show its state; check the cable and the subnet manager), or "
        "set `network.nccl_ib_disable: true` to use sockets on purpose"),
    # rehearsal
    "REHEARSAL": CodeDoc(
        "info",
        "the rehearsal passed: a few-second torchrun job on every node with the run's backend, interfaces and "
        "ports joined the rendezvous and ran an all-reduce at a gradient bucket's size, and its bus bandwidth"),
    "REHEARSAL_FAILED": CodeDoc(
        "error",
        "the rehearsal failed; the node to blame and the cause come from its log's failure signature",
        "the failure signature's fix (see the failure signatures below)"),
    "NCCL_NETWORK": CodeDoc(
        "info",
        "the network NCCL chose between the nodes in the rehearsal (`NET/IB` or `NET/Socket`)"),
    "NCCL_SOCKET_FALLBACK": CodeDoc(
        "warning",
        "NCCL fell back to sockets between nodes on a node that has InfiniBand/RoCE HCAs",
        "the HCA must be visible to the job (in a container `--device=/dev/infiniband --cap-add=IPC_LOCK`, "
        "`--ulimit memlock=-1`), its port ACTIVE, `NCCL_IB_HCA` must name it and, on RoCE, `NCCL_IB_GID_INDEX` "
        "a RoCE v2 GID; or `network.nccl_ib_disable: true` if sockets are what you want"),
}
