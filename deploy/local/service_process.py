"""capture or apply as a child process of a program that drives them (the demo, the
pipeline benchmarks): started in a session of its own, so a Ctrl-C reaches only the
driver, which stops the services in order; output appended to a log file."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from deploy.local.errors import LauncherError
from deploy.local.jars import PROJECT_ROOT

STOP_TIMEOUT_S = 120.0
"""How long a SIGTERM may take: capture delivers what it produced, apply ends its batch."""


class ServiceExited(LauncherError):  # noqa: N818 - reads as a sentence at the raise site
    """A service the driver started is no longer running."""


@dataclass
class ServiceProcess:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                cwd=PROJECT_ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def check(self) -> None:
        """Raise :class:`ServiceExited`, with the log's tail, if the process ended."""
        if self.process is not None and self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise ServiceExited(f"{self.name} exited ({self.process.returncode}):\n{tail}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to its whole session (a JVM child included) if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
