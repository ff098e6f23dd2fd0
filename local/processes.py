"""Child servers of the local stack: loopback ports, readiness, and a stop that always happens.

Each server runs as a child process with its stdin on a pipe that only we hold. The
children exit when that pipe closes, so even a parent killed with SIGKILL leaves
nothing behind; ``atexit`` and an explicit ``stop`` cover the ordinary paths. Only the
PID we started is ever signalled.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

LOOPBACK = "127.0.0.1"


class ServerStartError(RuntimeError):
    """A child server exited or never answered."""


def free_port(host: str = LOOPBACK) -> int:
    """A port free right now on ``host``; the caller retries if another process takes it first."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def terminate(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM the child we started, SIGKILL it if it lingers, and reap it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)


class ChildServer:
    """One server process: started with a log file, stopped by PID on ``stop`` or at exit."""

    def __init__(
        self, name: str, command: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None
    ):
        self.name = name
        self._command = list(command)
        self._cwd = cwd
        self._env = env
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def start(self) -> None:
        descriptor, log_name = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")
        self._log_path = Path(log_name)
        with os.fdopen(descriptor, "wb") as log:
            self._process = subprocess.Popen(
                self._command,
                cwd=self._cwd,
                env=self._env,
                # Our end of this pipe is the child's lifeline: it exits when the pipe closes.
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Out of the terminal's process group: Ctrl-C reaches us, and we stop the
                # children in order instead of racing them.
                start_new_session=True,
            )
        atexit.register(self.stop)

    def exited(self) -> bool:
        return self._process is not None and self._process.poll() is not None

    def wait_until(self, ready: Callable[[], bool], timeout_s: float) -> None:
        """Poll ``ready`` until it holds; raise with the child's log if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise ServerStartError(f"{self.name} exited with code {self._process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(Exception):
                if ready():
                    return
            time.sleep(0.1)
        raise ServerStartError(f"{self.name} did not answer within {timeout_s:.0f}s:\n{self.log_tail()}")

    def log_tail(self, max_chars: int = 4_000) -> str:
        if self._log_path is None or not self._log_path.exists():
            return "(no log)"
        return self._log_path.read_text(errors="replace")[-max_chars:]

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the child (SIGTERM, then SIGKILL) and remove its log; safe to call twice."""
        process = self._process
        if process is None:
            return
        self._process = None
        atexit.unregister(self.stop)
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        terminate(process, timeout_s)
        if self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()


class LoopbackServer(ABC):
    """A server on 127.0.0.1 in a child process: free port, start, wait until it answers, stop."""

    name: str
    start_attempts = 3

    def __init__(self, *, start_timeout_s: float = 60.0) -> None:
        self._start_timeout_s = start_timeout_s
        self._server: ChildServer | None = None
        self.port: int | None = None

    @abstractmethod
    def _command(self, port: int) -> list[str]:
        """The command line that serves on ``port``."""

    @abstractmethod
    def _answers(self) -> bool:
        """One request that succeeds once the server is ready."""

    def _working_directory(self) -> Path | None:
        return None

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise RuntimeError(f"{self.name} is not running")
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._server.pid if self._server else None

    def start(self) -> Self:
        # The port is free when picked but may be taken before the child binds it: try again.
        for attempt in range(1, self.start_attempts + 1):
            port = free_port()
            server = ChildServer(self.name, self._command(port), cwd=self._working_directory())
            server.start()
            self._server, self.port = server, port
            try:
                server.wait_until(self._answers, self._start_timeout_s)
                return self
            except ServerStartError:
                self.stop()
                if attempt == self.start_attempts:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        self._server, self.port = None, None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def alive(pid: int) -> bool:
    """Whether a process with this PID exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
