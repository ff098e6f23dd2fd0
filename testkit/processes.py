"""Child processes of the local stack: loopback ports, readiness, and a stop that always happens. Each child's stdin is
a pipe only we hold: the servers exit when it closes, so even a parent killed with SIGKILL leaves none behind; ``stop``
and ``atexit`` cover the ordinary paths. Only a PID we started is ever signalled."""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Self

LOOPBACK = "127.0.0.1"
# The servers' children run as ``python -m testkit.…``: from the repository's root.
_REPO_ROOT = Path(__file__).resolve().parent.parent


class ServerStartError(RuntimeError):
    """A child exited, or did not answer, while starting."""


def free_port() -> int:
    """A port free right now on 127.0.0.1; the caller retries if another process takes it first."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def alive(pid: int) -> bool:
    """Whether a process with this PID exists (one we may not signal counts as alive)."""
    try:
        with contextlib.suppress(PermissionError):
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def listening(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def children(pid: int) -> list[int]:
    """The PIDs of the processes whose parent is ``pid``, whichever of its threads started them."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            # The command name may hold spaces: the parent PID is the second field after its ")".
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def wait_for_parent() -> None:
    """Return once stdin closes: the parent holds its other end, so it has stopped us or died."""
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(4096):
            pass


class ChildProcess:
    """A process we started, its output in a temporary log file, stopped by PID (at exit too)."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        preexec_fn: Callable[[], object] | None = None,
    ) -> None:
        self.name = name
        descriptor, log_name = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
        self.log_path = Path(log_name)
        self._read = 0
        with os.fdopen(descriptor, "wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Out of the terminal's process group: Ctrl-C reaches us, and we stop the
                # children in order instead of racing them.
                start_new_session=True,
                preexec_fn=preexec_fn,  # noqa: PLW1509 (the one passed, prctl, takes no lock)
            )
        self.pid = self.process.pid
        atexit.register(self.stop)

    def _output(self, offset: int) -> bytes:
        with contextlib.suppress(OSError), self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read()
        return b""

    def log(self) -> str:
        """Everything the child has written (nothing once it is stopped)."""
        return self._output(0).decode("utf-8", errors="replace")

    def new_output(self) -> str:
        written = self._output(self._read)
        self._read += len(written)
        return written.decode("utf-8", errors="replace")

    def last_line(self) -> str:
        """The last line of output that is not a stack frame: usually why the child ended."""
        lines = [line for line in self.log().splitlines() if line.strip() and not line.startswith(("\t", "goroutine"))]
        return lines[-1] if lines else "(no output)"

    def wait_until(self, ready: Callable[[], bool], timeout_s: float) -> None:
        """Poll ``ready`` until it holds; ``ServerStartError`` if the child exits first or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(f"{self.name} exited with code {self.process.returncode}: {self.last_line()}")
            if ready():
                return
            time.sleep(0.02)
        raise ServerStartError(f"{self.name} did not answer within {timeout_s:.0f}s: {self.last_line()}")

    def stop(self) -> None:
        """Close the lifeline, SIGTERM the child (SIGKILL if it lingers), reap it, remove its log; idempotent."""
        atexit.unregister(self.stop)
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.log_path.unlink(missing_ok=True)


class Lifecycle(ABC):
    """``start`` on entering a ``with`` block, ``stop`` on leaving it."""

    @abstractmethod
    def start(self) -> Self: ...

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @contextlib.contextmanager
    def _stopped_on_failure(self) -> Iterator[None]:
        """Whatever fails while starting stops what was started, then propagates."""
        try:
            yield
        except BaseException:
            self.stop()
            raise


class LoopbackServer(Lifecycle):
    """A server on 127.0.0.1 in a child process: a free port, ready once it listens, stopped by PID."""

    name: str

    def __init__(self) -> None:
        self._child: ChildProcess | None = None
        self.port: int | None = None

    @abstractmethod
    def _command(self, port: int) -> list[str]:
        """The command line that serves on ``port`` and exits when its stdin closes."""

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise RuntimeError(f"{self.name} is not running")
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child else None

    def start(self) -> Self:
        # The port is free when picked but may be taken before the child binds it: two more tries.
        for _ in range(2):
            with contextlib.suppress(ServerStartError):
                return self._start_once()
        return self._start_once()

    def _start_once(self) -> Self:
        port = free_port()
        self._child, self.port = ChildProcess(self.name, self._command(port), cwd=_REPO_ROOT), port
        with self._stopped_on_failure():
            self._child.wait_until(lambda: listening(port), timeout_s=60.0)
        return self

    def stop(self) -> None:
        if self._child is not None:
            self._child.stop()
        self._child, self.port = None, None
