"""Start, watch and stop a background service process by pid.

A service is started detached (its own session, so Ctrl-C in ``make`` does not kill it
half-way), with stdout and stderr in a log file and its pid in a pid file next to its
data, so ``make down`` from another shell can stop it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from deploy.local.errors import LauncherError, ServiceNotReady

# The launcher owns the services it starts: keeping their Popen objects alive (instead of
# letting them be collected while the child runs) lets stop() reap them, and avoids
# "subprocess is still running" warnings in long-lived callers such as the test session.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def spawn(
    argv: Sequence[str],
    *,
    log_file: Path,
    pid_file: Path,
    env: dict[str, str] | None = None,
    user: str | None = None,
) -> int:
    """Start ``argv`` in the background; return its pid (also written to ``pid_file``)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    command = list(argv)
    if user is not None:
        command = ["runuser", "-u", user, "--", *command]
    with log_file.open("ab") as log:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    pid_file.write_text(f"{proc.pid}\n")
    _CHILDREN[proc.pid] = proc
    return proc.pid


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def alive(pid: int) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this process still answers kill(0); reap it so it reads as gone.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def wait_until(
    ready: Callable[[], bool],
    *,
    what: str,
    timeout_s: float,
    log_file: Path,
    pid: int | None = None,
) -> None:
    """Poll ``ready`` until it is true; fail with the log's tail if time runs out or the
    process dies first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        if pid is not None and not alive(pid):
            raise ServiceNotReady(f"{what} exited during start; last log lines:\n{tail(log_file)}")
        time.sleep(0.2)
    raise ServiceNotReady(
        f"{what} not ready after {timeout_s:.0f}s; see {log_file}. Last log lines:\n"
        f"{tail(log_file)}"
    )


def stop(pid_file: Path, *, what: str, timeout_s: float = 30.0) -> bool:
    """SIGTERM the process (group) in ``pid_file``, then SIGKILL after ``timeout_s``.

    Returns whether a running process was found.
    """
    pid = read_pid(pid_file)
    if pid is None or not alive(pid):
        pid_file.unlink(missing_ok=True)
        return False
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            _signal_group(pid, signal.SIGKILL)
            time.sleep(0.5)
            if alive(pid):
                raise LauncherError(f"{what} (pid {pid}) survived SIGKILL")
            break
        time.sleep(0.1)
    pid_file.unlink(missing_ok=True)
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        child.wait()
    return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    # The service leads its own session (start_new_session), so its group id is its pid;
    # signalling the group also reaches a `runuser` wrapper's child.
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        os.kill(pid, sig)


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    return "\n".join(text.splitlines()[-lines:])
