"""SSHTransport: the Transport protocol over one reused paramiko connection.

One connection per node carries every command (a channel each), SFTP and job
starts. Every step has a bound: TCP connect, banner, authentication, opening a
channel, each command (also enforced on the node with `timeout`, because closing
a channel without a pty does not stop the remote process). A long-lived stream
(`stream_lines`) runs under a pty instead, so that closing its channel ends it. Commands are argv
lists, each element shlex-quoted; nothing a user typed is ever pasted into a
shell string unquoted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import paramiko

from qwen_tui.base.shell import quote_argv
from qwen_tui.nodes.jobs import env_script, job_argv
from qwen_tui.nodes.programs import program
from qwen_tui.nodes.transport.hostkeys import ChangedHostKey, Consent, ConsentPolicy, HostKeyError, fingerprint
from qwen_tui.nodes.transport.node_commands import NodeCommands
from qwen_tui.nodes.transport.protocol import CommandResult, TransportError, check_stream_quiet

log = logging.getLogger(__name__)

# The shell scripts of a node's commands and jobs (each file's header says what it does and prints).
_IN_DIR = program("in_dir.sh")  # argv in a directory, without a shell seeing the directory's name
_DETACH = program("detach.sh")  # starts a detached job (job.sh) in a session of its own; prints its pid
# sshd's default MaxSessions is 10 channels per connection; stay under it.
MAX_CHANNELS = 8
_EXIT_GRACE_S = 2.0  # how long a stream waits for output after the command's exit status


@dataclass
class SSHTarget:
    """Where and how to reach one node, after ssh_config has been applied."""

    label: str
    hostname: str
    port: int = 22
    user: str | None = None
    identity_files: list[str] = field(default_factory=list)
    known_hosts: str = "~/.ssh/known_hosts"
    connect_timeout: float = 10.0
    look_for_keys: bool = True  # also try ~/.ssh/id_* and the agent when no IdentityFile is set
    jump: "SSHTarget" | None = None  # ssh_config ProxyJump: reach this host through that one

    @property
    def address(self) -> str:
        who = f"{self.user}@" if self.user else ""
        via = f" via {self.jump.address}" if self.jump is not None else ""
        return f"{who}{self.hostname}:{self.port}{via}"


class AuthFailed(TransportError):
    pass


class Unreachable(TransportError):
    pass


def _close_quietly(thing) -> None:
    """Close a paramiko client or SFTP session that may be dead already (reset()): nothing is left to release."""
    try:
        thing.close()
    except (OSError, EOFError, paramiko.SSHException) as e:
        log.debug("closing a dropped connection: %s", e)


class SSHTransport(NodeCommands):
    def __init__(self, target: SSHTarget, *, password: str | None = None,
                 accept_new_host_keys: Consent = False, passphrase: str | None = None):
        self.target = target
        self.label = target.label
        self._password = password  # memory only; needed again only to reconnect
        self._passphrase = passphrase  # the identity file's, memory only
        self._consent = accept_new_host_keys
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.RLock()  # guards the client and the one SFTP session
        self._connect_lock = threading.Lock()
        self._channels = threading.BoundedSemaphore(MAX_CHANNELS)
        self._home: str | None = None
        self._jump: SSHTransport | None = None  # the ProxyJump host's connection, when there is one

    # ------------------------------------------------------------ connection
    def connect(self) -> "SSHTransport":
        if self._active():
            return self
        with self._connect_lock:
            if not self._active():
                with self._lock:
                    self._close_locked()
                try:
                    client = self._new_client()
                except BaseException:
                    if self._jump is not None:  # the hop opened, the node did not: leave no connection behind
                        self._jump.close()
                        self._jump = None
                    raise
                with self._lock:
                    self._client = client
        return self

    def _active(self) -> bool:
        c = self._client
        tr = c.get_transport() if c is not None else None
        return tr is not None and tr.is_active()

    def _new_client(self) -> paramiko.SSHClient:
        t = self.target
        import os

        kh = os.path.expanduser(t.known_hosts)
        client = paramiko.SSHClient()
        if os.path.exists(kh):
            try:
                client.load_host_keys(kh)
            except (OSError, paramiko.SSHException) as e:
                raise HostKeyError(f"{t.label}: cannot read known_hosts {kh}: {e}") from None
        client.set_missing_host_key_policy(
            ConsentPolicy(t.label, t.hostname, t.port, kh, self._consent))
        keys = [os.path.expanduser(k) for k in t.identity_files]
        keys = [k for k in keys if os.path.exists(k)]
        ct = t.connect_timeout
        sock = self._jump_channel() if t.jump is not None else None
        try:
            client.connect(
                t.hostname, port=t.port, username=t.user, password=self._password,
                passphrase=self._passphrase, key_filename=keys or None, timeout=ct, banner_timeout=ct, auth_timeout=ct,
                channel_timeout=ct, allow_agent=t.look_for_keys, look_for_keys=t.look_for_keys and not keys,
                sock=sock)
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as e:
            client.close()
            raise ChangedHostKey(t.label, t.hostname, e.key, e.expected_key, kh) from None
        except paramiko.AuthenticationException as e:
            client.close()
            how = ", ".join(filter(None, [f"key {', '.join(keys)}" if keys else "",
                                          "password" if self._password else ""])) or "default keys/agent"
            raise AuthFailed(f"{t.label}: authentication failed for {t.address} (tried {how}): {e}") from None
        except (socket.timeout, TimeoutError):
            client.close()
            raise Unreachable(f"{t.label}: connect to {t.address} timed out after {ct:g}s") from None
        except paramiko.SSHException as e:
            client.close()
            if "No authentication methods" in str(e):
                raise AuthFailed(f"{t.label}: no key or password to log into {t.address} "
                                 f"(set cluster.identity_file or run the key setup)") from None
            raise TransportError(f"{t.label}: SSH to {t.address} failed: {e}") from None
        except OSError as e:
            client.close()
            raise Unreachable(f"{t.label}: cannot reach {t.address}: {e.strerror or e}") from None
        tr = client.get_transport()
        if tr is not None:
            tr.set_keepalive(15)  # a node that dies is noticed even on an idle connection
        return client

    def _jump_channel(self) -> paramiko.Channel:
        """A TCP channel from the ProxyJump host to this node's sshd, as `ssh -J` opens one. The jump host is
        logged into with keys or the agent only: this node's password is never sent to another host."""
        t = self.target
        assert t.jump is not None and self._jump is None  # connect() closed the last one
        self._jump = SSHTransport(t.jump, accept_new_host_keys=self._consent).connect()
        try:
            return self._jump._transport().open_channel(
                "direct-tcpip", (t.hostname, t.port), ("127.0.0.1", 0), timeout=t.connect_timeout)
        except paramiko.ChannelException as e:
            raise Unreachable(f"{t.label}: the jump host {t.jump.address} cannot open a connection to "
                              f"{t.hostname}:{t.port}: {e.text or e}") from None
        except (paramiko.SSHException, socket.timeout, TimeoutError, OSError) as e:
            raise Unreachable(f"{t.label}: no connection to {t.hostname}:{t.port} through the jump host "
                              f"{t.jump.address}: {e}") from None

    def server_key(self) -> paramiko.PKey:
        """The host key this connection verified."""
        return self._transport().get_remote_server_key()

    def host_key(self) -> str:
        k = self.server_key()
        return f"{k.get_name()} {fingerprint(k)}"

    def _transport(self) -> paramiko.Transport:
        self.connect()
        c = self._client
        tr = c.get_transport() if c is not None else None
        if tr is None or not tr.is_active():
            raise Unreachable(f"{self.label}: connection to {self.target.address} lost")
        return tr

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def reset(self) -> None:
        """Drop the connection without waiting for anything, so that the next command connects anew: after a
        read that timed out, the old TCP connection may hang for minutes (a link that drops packets) while a
        new one answers as soon as the node does. A read in flight on another thread fails at once."""
        client, self._client = self._client, None
        sftp, self._sftp = self._sftp, None
        jump, self._jump = self._jump, None
        if sftp is not None:
            _close_quietly(sftp)
        if client is not None:
            _close_quietly(client)
        if jump is not None:
            jump.reset()

    def _close_locked(self) -> None:
        if self._sftp is not None:
            try:
                self._sftp.close()
            except (OSError, paramiko.SSHException):
                pass  # closing a dead channel: nothing left to release
            self._sftp = None
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._jump is not None:
            self._jump.close()
            self._jump = None

    # ------------------------------------------------------------ commands
    @staticmethod
    def command_line(argv: Sequence[str], *, timeout: float | None = None,
                     env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
        """The one string sshd hands to the login shell: every element quoted."""
        full: list[str] = []
        if timeout is not None:
            # the node bounds the command too: a closed channel would not stop it
            full += ["timeout", "-k", "2", f"{max(1, int(timeout + 0.999))}"]
        if cwd is not None:
            full += ["sh", "-c", _IN_DIR, "sh", cwd]
        if env:
            full += ["env", *[f"{k}={v}" for k, v in env.items()]]
        full += list(argv)
        return quote_argv(full)

    def run(self, argv, *, timeout, input=None, env=None, cwd=None) -> CommandResult:
        if not argv:
            raise ValueError("empty argv")
        if cwd is not None and cwd.startswith("~"):
            cwd = self.abspath(cwd)
        cmd = self.command_line(argv, timeout=timeout, env=env, cwd=cwd)
        deadline = time.monotonic() + timeout + 3
        if not self._channels.acquire(timeout=timeout):
            return CommandResult(124, "", f"{self.label}: no free SSH channel within {timeout:g}s")
        try:
            try:
                chan = self._transport().open_session(timeout=self.target.connect_timeout)
            except (paramiko.SSHException, OSError, EOFError) as e:
                self.close()  # next call reconnects
                raise Unreachable(f"{self.label}: cannot open a channel to {self.target.address}: {e}") from None
            try:
                chan.settimeout(max(1.0, timeout))
                chan.exec_command(cmd)
                # Input goes out as the window allows while output is read: `cat` of a
                # large input would otherwise fill both windows and stall until timeout.
                pending = memoryview(input) if input else memoryview(b"")
                if not pending:
                    chan.shutdown_write()
                out, err = bytearray(), bytearray()
                while True:
                    got = False
                    if pending and chan.send_ready():
                        n = chan.send(pending[:32768])
                        pending = pending[n:]
                        got = True
                        if not pending:
                            chan.shutdown_write()
                    while chan.recv_ready():
                        out += chan.recv(65536)
                        got = True
                    while chan.recv_stderr_ready():
                        err += chan.recv_stderr(65536)
                        got = True
                    # sshd may send the exit status before the last output: the command is
                    # done only when the output has ended (EOF) too, or the channel closed.
                    drained = not chan.recv_ready() and not chan.recv_stderr_ready()
                    if drained and chan.exit_status_ready() and (chan.eof_received or chan.closed):
                        break
                    if chan.closed and drained and not chan.exit_status_ready():
                        raise Unreachable(f"{self.label}: channel closed before the command finished")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return CommandResult(124, out.decode(errors="replace"),
                                             err.decode(errors="replace") +
                                             f"\ntimed out after {timeout:g}s: {quote_argv(argv)}")
                    if not got:
                        select.select([chan], [], [], min(0.05, left))
                rc = chan.recv_exit_status()
                # `timeout` exits 124 (TERM) or 137 (KILL) when the node's own bound hit
                if rc == -1:
                    rc = 255
                return CommandResult(rc, out.decode(errors="replace"), err.decode(errors="replace"))
            except (socket.timeout, TimeoutError):
                return CommandResult(124, "", f"timed out after {timeout:g}s: {quote_argv(argv)}")
            except (paramiko.SSHException, OSError, EOFError) as e:
                raise Unreachable(f"{self.label}: connection failed during a command: {e}") from None
            finally:
                chan.close()
        finally:
            self._channels.release()

    # ------------------------------------------------------------ streams
    def stream_lines(self, argv: Sequence[str], *, stop: threading.Event, timeout_first_line: float = 15.0,
                     idle_timeout: float | None = None, poll: float = 0.2) -> Iterator[str]:
        """Run one long-lived command and yield its output lines as they arrive, until
        `stop` is set, the command ends, or the consumer closes the iterator.

        The command gets a pty: when the channel closes (stop, an error, the
        connection dropping, this process dying) sshd closes the pty and the kernel
        hangs up the remote command. Without a pty it would live on. With the pty,
        stderr arrives merged into the lines. Every wait is bounded: the stop flag is
        looked at every `poll` seconds; no first line within `timeout_first_line`
        (or silence longer than `idle_timeout` later) raises TransportError."""
        if not argv:
            raise ValueError("empty argv")
        if not self._channels.acquire(timeout=timeout_first_line):
            raise TransportError(f"{self.label}: no free SSH channel within {timeout_first_line:g}s")
        try:
            try:
                chan = self._transport().open_session(timeout=self.target.connect_timeout)
            except (paramiko.SSHException, OSError, EOFError) as e:
                self.close()
                raise Unreachable(f"{self.label}: cannot open a channel to {self.target.address}: {e}") from None
            try:
                # `exec`: the login shell becomes the command, one process on the node
                chan.get_pty(term="dumb", width=1000, height=24)
                chan.exec_command("exec " + quote_argv(argv))
                chan.settimeout(0.0)
                buf = bytearray()
                started = last = time.monotonic()
                got_line = False
                exited_at: float | None = None
                while not stop.is_set():
                    select.select([chan], [], [], poll)
                    try:
                        data = chan.recv(65536) if chan.recv_ready() else None
                    except socket.timeout:
                        data = None
                    now = time.monotonic()
                    if data is None:
                        if chan.closed or chan.eof_received:
                            break
                        # the exit status can come before the last output; a child that
                        # keeps the pty open must not hold the stream past a short grace
                        if chan.exit_status_ready():
                            exited_at = exited_at if exited_at is not None else now
                            if now - exited_at > _EXIT_GRACE_S:
                                break
                            continue
                        check_stream_quiet(self.label, argv, now, started, last, got_line, timeout_first_line,
                                           idle_timeout)
                        continue
                    if not data:  # EOF
                        break
                    last = now
                    buf += data
                    while b"\n" in buf:
                        line, _, rest = bytes(buf).partition(b"\n")
                        buf = bytearray(rest)
                        got_line = True
                        yield line.rstrip(b"\r").decode(errors="replace")
                        if stop.is_set():
                            return
                if buf and not stop.is_set():
                    yield bytes(buf).rstrip(b"\r").decode(errors="replace")
            except (paramiko.SSHException, OSError, EOFError) as e:
                raise Unreachable(f"{self.label}: connection failed during a stream: {e}") from None
            finally:
                chan.close()  # sshd closes the pty: the command gets SIGHUP
        finally:
            self._channels.release()

    # ------------------------------------------------------------ detached jobs
    def start_job(self, argv, *, env, cwd, log, rcfile, timeout=30.0, run_id="") -> int:
        # Absolute before the job cds into cwd: the log is then where read_file looks.
        cwd, log, rcfile = self.abspath(cwd), self.abspath(log), self.abspath(rcfile)
        envfile = rcfile + ".env"
        inner = job_argv(argv, cwd, log, rcfile, envfile=envfile, run_id=run_id)
        dirs = [posixpath.dirname(log) or ".", posixpath.dirname(rcfile) or "."]
        r = self.run(["sh", "-c", _DETACH, "sh", *dirs, envfile, run_id, *inner], timeout=timeout,
                     input=env_script(dict(env)))
        if not r.ok:
            raise TransportError(f"{self.label}: could not start job (rc {r.rc}): {r.stderr.strip()[-500:]}")
        try:
            return int(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise TransportError(f"{self.label}: job start printed no pid: {r.stdout!r} {r.stderr!r}") from None

    # ------------------------------------------------------------ files
    def _sftp_client(self, timeout: float) -> paramiko.SFTPClient:
        with self._lock:
            if self._sftp is None or self._sftp.get_channel() is None or self._sftp.get_channel().closed:
                try:
                    self._sftp = paramiko.SFTPClient.from_transport(
                        self._transport(), window_size=4 << 20, max_packet_size=32768)
                except (paramiko.SSHException, OSError, EOFError) as e:
                    raise Unreachable(f"{self.label}: cannot start SFTP: {e}") from None
            self._sftp.get_channel().settimeout(timeout)
            return self._sftp

    def read_file(self, path, *, offset=0, limit=1 << 20, timeout=15.0) -> bytes:
        path = self.abspath(path)
        with self._lock:  # one SFTP session per connection, used by one thread at a time
            sftp = self._sftp_client(timeout)
            try:
                with sftp.open(path, "rb") as f:
                    f.seek(offset)
                    return f.read(limit)
            except FileNotFoundError:
                return b""
            except (socket.timeout, TimeoutError):
                self._sftp = None
                raise TransportError(f"{self.label}: reading {path} timed out after {timeout:g}s") from None
            except (paramiko.SSHException, EOFError) as e:
                self._sftp = None
                raise TransportError(f"{self.label}: reading {path} failed: {e}") from None

    def put_file(self, local, remote, *, timeout=600.0, progress: Callable[[int, int], None] | None = None) -> None:
        """Copy to `remote.part`, then rename: a reader never sees half a file."""
        remote = self.abspath(remote)
        parent = posixpath.dirname(remote)
        if parent:
            r = self.run(["mkdir", "-p", "--", parent], timeout=min(timeout, 30))
            if not r.ok:
                raise TransportError(f"{self.label}: mkdir {parent}: {r.stderr.strip()}")
        # A fresh name opened with O_CREAT|O_EXCL ("wx"): a planted `.part` link is never followed.
        tmp = f"{remote}.{secrets.token_hex(4)}.part"
        with self._lock:
            sftp = self._sftp_client(timeout)
            try:
                try:
                    self._put_exclusive(sftp, local, tmp, progress)
                    sftp.posix_rename(tmp, remote)
                except BaseException:
                    # never created, or the connection is gone: the error raised below says which
                    with contextlib.suppress(OSError, paramiko.SSHException, EOFError):
                        sftp.remove(tmp)
                    raise
            except (socket.timeout, TimeoutError):
                self._sftp = None
                raise TransportError(f"{self.label}: copying to {remote} timed out after {timeout:g}s") from None
            except (paramiko.SSHException, OSError, EOFError) as e:
                self._sftp = None
                raise TransportError(f"{self.label}: copying to {remote} failed: {e}") from None

    @staticmethod
    def _put_exclusive(sftp: paramiko.SFTPClient, local: str, tmp: str,
                       progress: Callable[[int, int], None] | None) -> None:
        size = os.path.getsize(local)
        done = 0
        with open(local, "rb") as src, sftp.open(tmp, "wxb") as dst:
            dst.set_pipelined(True)
            while chunk := src.read(32768):
                dst.write(chunk)
                done += len(chunk)
                if progress:
                    progress(done, size)
        got = sftp.stat(tmp).st_size
        if got != size:
            raise OSError(f"size mismatch after copying: {got} != {size}")

    def get_file(self, remote, local, *, timeout=600.0, progress: Callable[[int, int], None] | None = None) -> None:
        remote = self.abspath(remote)
        with self._lock:
            sftp = self._sftp_client(timeout)
            try:
                sftp.get(remote, local, callback=progress)
            except (socket.timeout, TimeoutError):
                self._sftp = None
                raise TransportError(f"{self.label}: reading {remote} timed out after {timeout:g}s") from None
            except (paramiko.SSHException, OSError, EOFError) as e:
                self._sftp = None
                raise TransportError(f"{self.label}: reading {remote} failed: {e}") from None

    def __repr__(self) -> str:
        return f"SSHTransport({self.label!r}, {self.target.address})"

