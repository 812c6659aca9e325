"""ssh_config read the way OpenSSH reads it.

Where the ssh client exists, each host is resolved by `ssh -G HOST`: OpenSSH
itself applies Include (globs, relative to ~/.ssh), Match, `Key=value`, first
value wins, tokens and canonicalisation, and prints the result. Only what differs
from OpenSSH's compiled defaults (`ssh -G -F none HOST`) counts as configured,
so that an unset IdentityFile still lets qwen-tui try the agent and ~/.ssh/id_*.

Without an ssh client, paramiko reads the file, with every `Include` expanded
first (paramiko 5 ignores Include: a node defined in an included file would
silently get the wrong user, port and jump host). The one approximation: an
Include inside a Host or Match block has its own Host blocks applied
unconditionally, where OpenSSH applies them only when the outer block matches.

Both give `lookup(host) -> dict` in paramiko's shape: lower-case keys, string
values, `identityfile` a list.
"""

from __future__ import annotations

import getpass
import glob
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
from typing import Protocol

import paramiko

from qwen_tui.nodes.transport.protocol import TransportError

SSH_G_TIMEOUT = 10.0  # `ssh -G` reads files only, unless a `Match exec` runs a command
MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH
# Keys OpenSSH may print on several lines; every other key has one value.
_MULTI = {"identityfile", "certificatefile", "localforward", "remoteforward", "dynamicforward", "sendenv",
          "setenv", "canonicaldomains", "permitremoteopen"}
_LINE = re.compile(r"\s*(\w+)(?:\s*=\s*|\s+)(.*?)\s*$")  # `Key value`, `Key=value`, `Key = value`


class SSHConfigLookup(Protocol):
    def lookup(self, hostname: str) -> dict: ...


def ssh_client() -> str | None:
    """The OpenSSH client on PATH, or None (then paramiko reads the file)."""
    return shutil.which("ssh")


def _home() -> str:
    """The passwd entry's home, as OpenSSH takes it ($HOME when the uid has no entry, as in some containers)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return os.path.expanduser("~")


def user_ssh_dir() -> str:
    """Where OpenSSH looks for relative Include paths of a user's config: ~/.ssh."""
    return os.path.join(_home(), ".ssh")


def load(path: str | None, *, ssh: str | None = None, use_ssh: bool = True,
         ssh_dir: str | None = None) -> SSHConfigLookup | None:
    """The ssh_config of a preset: `path`, or the user's own config when None.

    With an ssh client, `ssh -G` resolves hosts (with no path: ~/.ssh/config and the
    system-wide file, as a plain `ssh` does). Without one, paramiko reads `path` or
    ~/.ssh/config with its Includes expanded; None when there is nothing to read.
    A named file that does not exist is an error."""
    if path is not None:
        path = os.path.expanduser(path)
        if not os.path.exists(path):
            raise TransportError(f"cluster.ssh_config: {path} does not exist")
    client = (ssh or ssh_client()) if use_ssh else None
    if client is not None:
        cfg = OpenSSHConfig(path, client)
        cfg.check()
        return cfg
    if path is None:
        path = os.path.join(ssh_dir or user_ssh_dir(), "config")
        if not os.path.exists(path):
            return None
    return ParamikoConfig(path, ssh_dir=ssh_dir)


# ---------------------------------------------------------------- ssh -G
def parse_ssh_g(text: str) -> dict[str, list[str]]:
    """`ssh -G` output: one `key value` a line; a key may repeat (identityfile)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            out.setdefault(key.lower(), []).append(value.strip())
    return out


class OpenSSHConfig:
    """Hosts resolved by the ssh client (`ssh -G`), once each."""

    def __init__(self, path: str | None, ssh: str):
        self.path, self.ssh = path, ssh
        self._cache: dict[str, dict] = {}
        self._defaults: dict[str, list[str]] | None = None

    @property
    def where(self) -> str:
        return f"cluster.ssh_config {self.path}" if self.path else "ssh_config (~/.ssh/config)"

    def check(self) -> None:
        """Fail now, naming the file, when OpenSSH refuses the config (a bad line, a bad Include)."""
        self._run(self.path, "qwen-tui-config-check", what="OpenSSH refuses it")

    def _run(self, config: str | None, host: str, what: str = "") -> dict[str, list[str]]:
        argv = [self.ssh, "-G", "-T", *(["-F", config] if config else []), "--", host]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=SSH_G_TIMEOUT,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise TransportError(f"{self.where}: `ssh -G {host}` gave no answer within {SSH_G_TIMEOUT:g}s "
                                 "(a Match exec that hangs?)") from None
        except OSError as e:
            raise TransportError(f"{self.where}: cannot run {self.ssh}: {e}") from None
        if p.returncode != 0:
            why = "; ".join(ln for ln in p.stderr.strip().splitlines()
                            if not ln.startswith("Pseudo-terminal")) or f"exit status {p.returncode}"
            raise TransportError(f"{self.where}: {what or f'OpenSSH cannot resolve {host!r}'}: {why}")
        return parse_ssh_g(p.stdout)

    def lookup(self, hostname: str) -> dict:
        if hostname not in self._cache:
            if self._defaults is None:
                self._defaults = self._run("none", "qwen-tui-defaults")
            got = self._run(self.path, hostname)
            self._cache[hostname] = configured(got, self._defaults, hostname)
        return dict(self._cache[hostname])


def configured(got: dict[str, list[str]], defaults: dict[str, list[str]], host: str) -> dict:
    """What `ssh -G` printed minus OpenSSH's defaults, in paramiko's shape. HostName is always kept
    (ssh's own answer: the alias, lower-cased, when nothing sets it)."""
    out: dict = {}
    for key, values in got.items():
        if key == "host" or (key != "hostname" and values == defaults.get(key)):
            continue
        if key == "identityfile":
            out[key] = [expand_tokens(v, got, host) for v in values if v.lower() != "none"]
        elif key in _MULTI:
            out[key] = values
        else:
            out[key] = values[0]
    return out


_TOKEN = re.compile(r"%(.)")


def expand_tokens(value: str, got: dict[str, list[str]], host: str) -> str:
    """The % tokens OpenSSH expands in IdentityFile when it uses it (`ssh -G` prints them unexpanded)."""
    def one(k: str) -> str:
        return (got.get(k) or [""])[0]

    fqdn = socket.gethostname()
    table = {"%": "%", "d": _home(), "u": getpass.getuser(), "i": str(os.getuid()),
             "h": one("hostname"), "p": one("port"), "r": one("user"), "n": host,
             "l": fqdn, "L": fqdn.split(".")[0]}

    def sub(m: re.Match) -> str:
        if m.group(1) not in table:
            raise TransportError(f"ssh_config IdentityFile {value!r} for {host}: the token %{m.group(1)} "
                                 "is not one qwen-tui expands (%d %u %h %p %r %n %l %L %i %%)")
        return table[m.group(1)]

    return _TOKEN.sub(sub, value)


# ---------------------------------------------------------------- paramiko + Include
class ParamikoConfig:
    """paramiko's reader over the file with its Includes expanded."""

    def __init__(self, path: str, *, ssh_dir: str | None = None):
        self.path = path
        try:
            self._config = paramiko.SSHConfig.from_text(expand_includes(path, ssh_dir=ssh_dir))
        except (paramiko.SSHException, ValueError) as e:  # ConfigParseError is an SSHException
            raise TransportError(f"cluster.ssh_config: cannot read {path}: {e}") from None

    def lookup(self, hostname: str) -> dict:
        cfg = dict(self._config.lookup(hostname))
        if cfg.get("proxycommand", "") is None:  # paramiko's spelling of `ProxyCommand none`
            del cfg["proxycommand"]
        return cfg


def split_line(line: str) -> tuple[str, str]:
    """(lower-case keyword, arguments) of one config line; ("", "") for a blank or comment line."""
    s = line.strip()
    if not s or s.startswith("#"):
        return "", ""
    m = _LINE.match(s)
    if not m:
        return s.lower(), ""
    return m.group(1).lower(), m.group(2)


def include_paths(args: str, ssh_dir: str) -> list[str]:
    """The files one `Include` line names, as OpenSSH finds them: each argument tilde-expanded, made
    relative to ~/.ssh when not absolute, then globbed (sorted; a pattern matching nothing is fine)."""
    try:
        words = shlex.split(args)
    except ValueError as e:
        raise TransportError(f"ssh_config: Include {args!r}: {e}") from None
    out: list[str] = []
    for w in words:
        w = os.path.expanduser(w)
        if not os.path.isabs(w):
            w = os.path.join(ssh_dir, w)
        out += [p for p in sorted(glob.glob(w)) if not os.path.isdir(p)]
    return out


def expand_includes(path: str, *, ssh_dir: str | None = None, _depth: int = 0) -> str:
    """The config text with every Include replaced by the files it names, recursively. After an
    included file, the block the Include stood in is opened again (OpenSSH returns to it)."""
    if _depth > MAX_INCLUDE_DEPTH:
        raise TransportError(f"ssh_config: Include nested more than {MAX_INCLUDE_DEPTH} deep at {path} "
                             "(a file that includes itself?)")
    ssh_dir = ssh_dir or user_ssh_dir()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise TransportError(f"ssh_config: cannot read {path}: {e.strerror or e}") from None
    out: list[str] = []
    block = "Host *"  # the top level applies to every host, as `Host *` does
    for line in text.splitlines():
        key, args = split_line(line)
        if key in ("host", "match"):
            block = line.strip()
        if key != "include":
            out.append(line)
            continue
        for inc in include_paths(args, ssh_dir):
            out.append(f"# qwen-tui: Include {inc}")
            out.append(expand_includes(inc, ssh_dir=ssh_dir, _depth=_depth + 1))
            out.append(block)
    return "\n".join(out) + "\n"


def import_text(path: str, *, ssh_dir: str | None = None) -> str:
    """A config's text for the host import: Includes expanded, so their Host entries are offered too."""
    return expand_includes(os.path.expanduser(path), ssh_dir=ssh_dir)


def ssh_config_import_text(path: str) -> str:
    """An ssh_config's text for the wizard's host import, its Includes expanded (ValueError when unreadable)."""
    from qwen_tui.nodes.transport.protocol import TransportError

    try:
        return import_text(path)
    except TransportError as e:
        raise ValueError(str(e)) from None
