"""The function in Lambda's own runtime: the Runtime Interface Emulator driving ``python -m awslambdaric``.

One ``LambdaEnvironment`` is one execution environment: an emulator process (the one
``sam local invoke`` runs in its container, shipped in SAM CLI's wheel) and the runtime
interface client it starts, on the function's Python 3.12 venv, with the variables Lambda
sets and Lambda's CPU share. The runtime receives the event as JSON, builds the context
from the deadline and serialises the response; on timeout the emulator kills it and the
next invocation initialises a new one (a real cold start, whose init time is logged).

An environment serves one invocation at a time (a lock: two concurrent requests crash the
emulator), as Lambda's do; ``LambdaFleet`` holds one per concurrent invocation. Both bind
127.0.0.1 only and stop by PID; a parent that dies takes them with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import itertools
import json
import logging
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Self, TextIO

from local import cpu_quota
from local.aws import REGION
from local.invocation import FunctionError, Invocation
from local.lambda_venv import LAMBDA_PYTHON_VERSION, venv_python
from local.processes import LOOPBACK, free_port, terminate
from local.resources import FunctionSpec
from local.state import REPO_ROOT

INVOKE_PATH = "/2015-03-31/functions/function/invocations"
_START_ATTEMPTS = 3
_START_TIMEOUT_S = 10.0
# Beyond the function's Timeout, how long to wait for the emulator's own timeout answer.
_ANSWER_SLACK_S = 30.0
_TIMED_OUT = re.compile(rb"^Task timed out after [0-9.]+ seconds")
_INIT_REPORT = re.compile(r"INIT REPORT\(durationMs: ([0-9.]+)\)")
_REQUEST_ID = re.compile(r"START RequestId: (\S+)")
_PORT_TAKEN = re.compile(r"listen tcp [0-9.]+:([0-9]+): bind: address already in use")
_ERROR_KEYS = frozenset({"errorType", "errorMessage"})
_ERROR_DOCUMENT_KEYS = _ERROR_KEYS | {"requestId", "stackTrace"}
_PR_SET_PDEATHSIG = 1
_SINK_LOCK = threading.Lock()
_quota_note_lock = threading.Lock()
_quota_noted = False
# Handlers that imported once in this process need no second check (the code does not change under us).
_handlers_checked: set[tuple[str, str, str]] = set()

logger = logging.getLogger(__name__)


class RuntimeStartError(RuntimeError):
    """An execution environment could not start (the message names the cause)."""


class PortTaken(RuntimeStartError):
    """A port the emulator was told to bind is in use."""


class HandlerImportError(RuntimeStartError):
    """The function's handler string does not import in the function's runtime."""


class EmulatorExited(RuntimeError):
    """The emulator process died: the environment is gone."""


def emulator_binary() -> Path:
    """The Runtime Interface Emulator for this machine's architecture, from SAM CLI's wheel."""
    arch = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    if arch is None:
        raise RuntimeStartError(f"the Lambda runtime emulator has no build for {platform.machine()}")
    found = sorted(
        (REPO_ROOT / ".venv-sam").glob(f"lib/python*/site-packages/samcli/local/rapid/aws-lambda-rie-{arch}")
    )
    if not found:
        raise RuntimeStartError(
            "the Lambda runtime emulator is missing: it comes with SAM CLI's wheel in .venv-sam (run `make venv-sam`)"
        )
    return found[-1]


def lambda_variables(function: FunctionSpec, python: Path) -> dict[str, str]:
    """The variables Lambda's Python runtime sets in every execution environment."""
    stream = f"{time.strftime('%Y/%m/%d', time.gmtime())}/[$LATEST]{uuid.uuid4().hex}"
    return {
        "PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "en_US.UTF-8",
        "TZ": ":UTC",
        "_HANDLER": function.handler,
        "LAMBDA_TASK_ROOT": str(function.code_dir),
        "LAMBDA_RUNTIME_DIR": str(python.parent.parent),
        "AWS_EXECUTION_ENV": f"AWS_Lambda_python{LAMBDA_PYTHON_VERSION}",
        "AWS_LAMBDA_FUNCTION_NAME": function.name,
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(function.memory_mb),
        "AWS_LAMBDA_FUNCTION_TIMEOUT": str(function.timeout_s),
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
        "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{function.name}",
        "AWS_LAMBDA_LOG_STREAM_NAME": stream,
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
    }


def check_handler(function: FunctionSpec, environment: Mapping[str, str], python: Path) -> None:
    """Import the handler as the runtime would, so a bad handler string fails before anything starts."""
    checked = (function.handler, str(function.code_dir), str(python))
    if checked in _handlers_checked:
        return
    module, _, attribute = function.handler.rpartition(".")
    probe = "import importlib, sys; getattr(importlib.import_module(sys.argv[1]), sys.argv[2])"
    answer = subprocess.run(
        [str(python), "-c", probe, module or function.handler, attribute],
        cwd=function.code_dir,
        env={**environment, **lambda_variables(function, python), "PYTHONPATH": str(function.code_dir)},
        capture_output=True,
        text=True,
        check=False,
    )
    if answer.returncode != 0:
        cause = (answer.stderr.strip().splitlines() or [f"exit code {answer.returncode}"])[-1]
        raise HandlerImportError(
            f"the handler {function.handler!r} does not import from {function.code_dir} "
            f"(Runtime.ImportModuleError): {cause}"
        )
    _handlers_checked.add(checked)


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: the kernel kills the emulator when the thread
    # that started it dies, so even a parent killed with SIGKILL leaves no emulator behind.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _note_no_quota(reason: str) -> None:
    global _quota_noted  # noqa: PLW0603 (one line per process, whatever the number of environments)
    with _quota_note_lock:
        if not _quota_noted:
            print(f"note: Lambda's CPU share not applied ({reason}): the function gets the whole CPU", file=sys.stderr)
            _quota_noted = True


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            # The command name may hold spaces: the parent PID is the second field after its ")".
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


class LambdaEnvironment:
    """One execution environment: emulator + runtime, one invocation at a time.

    ``emulator_port`` and ``runtime_api_port`` default to free ports (retried if taken
    meanwhile); given explicitly, a taken one is an error. ``log_sink`` receives what the
    environment logs during each invocation (the lines CloudWatch would hold).
    """

    def __init__(
        self,
        function: FunctionSpec,
        environment: Mapping[str, str],
        *,
        python: Path,
        name: str = "env",
        cpu_share: bool = True,
        emulator_port: int | None = None,
        runtime_api_port: int | None = None,
        log_sink: TextIO | None = None,
    ) -> None:
        self.function = function
        self.name = name
        self._environment = {**environment, **lambda_variables(function, python)}
        self._python = python
        self._cpu_share = cpu_share
        self._ports = (emulator_port, runtime_api_port)
        self._log_sink = log_sink
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._quota: cpu_quota.CpuQuota | None = None
        self.port: int | None = None
        self.cold_starts = 0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def runtime_pid(self) -> int | None:
        """The runtime process the emulator runs now (none before the first invocation or after a reset)."""
        children = _children(self._process.pid) if self._process else []
        return children[0] if children else None

    @property
    def quota(self) -> cpu_quota.CpuQuota | None:
        return self._quota

    def start(self) -> Self:
        explicit = any(port is not None for port in self._ports)
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                self._start_once()
                return self
            except PortTaken:
                self.stop()
                if explicit or attempt == _START_ATTEMPTS:
                    raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _start_once(self) -> None:
        emulator_port = self._ports[0] or free_port()
        api_port = self._ports[1] or free_port()
        for port in (emulator_port, api_port):
            # Another listener on the port would answer our readiness probe: refuse it up front.
            if not _bindable(port):
                raise PortTaken(
                    f"port {LOOPBACK}:{port} is already in use: the Lambda runtime emulator cannot listen on it"
                )
        descriptor, log_name = tempfile.mkstemp(prefix=f"lambda-{self.name}-", suffix=".log")
        self._log_path = Path(log_name)
        command = [
            str(emulator_binary()),
            "--runtime-interface-emulator-address",
            f"{LOOPBACK}:{emulator_port}",
            "--runtime-api-address",
            f"{LOOPBACK}:{api_port}",
            str(self._python),
            "-m",
            "awslambdaric",
            self.function.handler,
        ]
        with os.fdopen(descriptor, "wb") as log:
            self._process = subprocess.Popen(
                command,
                cwd=self.function.code_dir,
                env=self._environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 (prctl only: nothing that takes a lock)
            )
        self.port = emulator_port
        self._apply_cpu_share()
        self._wait_until_listening(emulator_port)

    def _apply_cpu_share(self) -> None:
        # The emulator starts the runtime on the first invocation, so the runtime inherits the cgroup.
        if not self._cpu_share or self._process is None:
            return
        try:
            self._quota = cpu_quota.create(cpu_quota.unique_name(self.name), self.function.memory_mb)
            self._quota.add(self._process.pid)
        except cpu_quota.CpuQuotaUnavailable as unavailable:
            if self._quota is not None:
                self._quota.remove()
            self._quota = None
            _note_no_quota(str(unavailable))

    def _wait_until_listening(self, port: int) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                raise self._start_failure()
            with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=0.5):
                return
            time.sleep(0.02)
        raise RuntimeStartError(
            f"the Lambda runtime emulator did not listen on {LOOPBACK}:{port} within "
            f"{_START_TIMEOUT_S:.0f}s: {self._last_log_line()}"
        )

    def _start_failure(self) -> RuntimeStartError:
        log = self._log_text()
        taken = _PORT_TAKEN.search(log)
        if taken:
            return PortTaken(
                f"port {LOOPBACK}:{taken.group(1)} is already in use: the Lambda runtime emulator cannot listen on it"
            )
        code = self._process.returncode if self._process else None
        return RuntimeStartError(f"the Lambda runtime emulator exited at start (code {code}): {self._last_log_line()}")

    def _log_text(self, offset: int = 0) -> str:
        if self._log_path is None:
            return ""
        with contextlib.suppress(OSError), self._log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode("utf-8", errors="replace")
        return ""

    def _log_size(self) -> int:
        with contextlib.suppress(OSError):
            return self._log_path.stat().st_size if self._log_path else 0
        return 0

    def _last_log_line(self) -> str:
        lines = [
            line for line in self._log_text().splitlines() if line.strip() and not line.startswith(("\t", "goroutine"))
        ]
        return lines[-1] if lines else "(no output)"

    def invoke(self, event: dict[str, Any]) -> Invocation:
        """One invocation, as Lambda's Invoke API would run it; one at a time per environment."""
        payload = json.dumps(event).encode()
        with self._lock:
            if self._process is None or self.port is None:
                raise RuntimeError(f"the execution environment {self.name} is not running")
            offset = self._log_size()
            started = time.monotonic()
            status, body = self._post(payload)
            duration_s = time.monotonic() - started
            logged = self._log_text(offset)
        if self._log_sink is not None and logged:
            with _SINK_LOCK:
                self._log_sink.write(logged)
                self._log_sink.flush()
        init = _INIT_REPORT.search(logged)
        init_ms = float(init.group(1)) if init else None
        if init_ms is not None:
            self.cold_starts += 1
            logger.info("cold start of %s (%s): init %.0f ms", self.function.name, self.name, init_ms)
        request = _REQUEST_ID.search(logged)
        request_id = request.group(1) if request else ""
        if _TIMED_OUT.match(body):
            return Invocation(None, None, True, duration_s, request_id, init_ms)
        response, error = _parse_answer(status, body)
        return Invocation(response, error, False, duration_s, request_id, init_ms)

    def _post(self, payload: bytes) -> tuple[int, bytes]:
        assert self.port is not None
        connection = http.client.HTTPConnection(LOOPBACK, self.port, timeout=self.function.timeout_s + _ANSWER_SLACK_S)
        try:
            connection.request("POST", INVOKE_PATH, body=payload, headers={"Content-Type": "application/json"})
            answer = connection.getresponse()
            return answer.status, answer.read()
        except (OSError, http.client.HTTPException) as error:
            if self._process is not None and self._process.poll() is not None:
                raise EmulatorExited(
                    f"the Lambda runtime emulator of {self.name} (pid {self._process.pid}) exited with code "
                    f"{self._process.returncode}: {self._last_log_line()}"
                ) from error
            raise EmulatorExited(f"the Lambda runtime emulator of {self.name} did not answer: {error}") from error
        finally:
            connection.close()

    def kill_runtime(self) -> bool:
        """SIGKILL the runtime process, as a crash kills Lambda's; the emulator starts a new one next time."""
        pid = self.runtime_pid
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return True

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the emulator (it stops its runtime), then anything of ours it left; safe to call twice."""
        process, self._process, self.port = self._process, None, None
        if process is not None:
            runtime = _children(process.pid) if process.poll() is None else []
            terminate(process, timeout_s)
            for pid in runtime:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self._quota is not None:
            self._quota.remove()
            self._quota = None
        if self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()
            self._log_path = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _parse_answer(status: int, body: bytes) -> tuple[Any, BaseException | None]:
    """The response, or Lambda's error document as a ``FunctionError``."""
    try:
        document = json.loads(body) if body else None
    except ValueError:
        text = body[:200].decode("utf-8", errors="replace")
        return None, FunctionError("Runtime.InvalidResponse", f"the emulator answered {status}: {text}")
    # The emulator marks no error header: Lambda's error document is recognised by its keys.
    if isinstance(document, dict) and _ERROR_KEYS <= set(document) <= _ERROR_DOCUMENT_KEYS:
        return None, FunctionError(str(document["errorType"]), str(document["errorMessage"]))
    if status != http.HTTPStatus.OK:
        return None, FunctionError("Runtime.InvalidResponse", f"the emulator answered {status}")
    return document, None


class LambdaFleet:
    """Execution environments of one function: one per concurrent invocation, all stopped together.

    ``memory_mb`` overrides the template's ``MemorySize`` (and so the CPU share). The
    handler is checked once, before any environment starts.
    """

    def __init__(
        self,
        function: FunctionSpec,
        environment: Mapping[str, str],
        *,
        memory_mb: int | None = None,
        cpu_share: bool = True,
        log_sink: TextIO | None = None,
    ) -> None:
        self.function = replace(function, memory_mb=memory_mb) if memory_mb else function
        self.environment = dict(environment)
        self._cpu_share = cpu_share
        self._log_sink = log_sink
        self._python = venv_python()
        self._lock = threading.Lock()
        self._names = itertools.count()
        self.environments: list[LambdaEnvironment] = []
        check_handler(self.function, self.environment, self._python)

    def add(self) -> LambdaEnvironment:
        """One more execution environment, started."""
        environment = LambdaEnvironment(
            self.function,
            self.environment,
            python=self._python,
            name=f"env-{next(self._names)}",
            cpu_share=self._cpu_share,
            log_sink=self._log_sink,
        ).start()
        with self._lock:
            self.environments.append(environment)
        return environment

    def start(self, count: int) -> Self:
        try:
            for _ in range(count):
                self.add()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        with self._lock:
            environments, self.environments = self.environments, []
        for environment in environments:
            environment.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_fleet(
    function: FunctionSpec, environment: Mapping[str, str], count: int, *, memory_mb: int | None = None
) -> LambdaFleet:
    """``count`` execution environments of ``function`` at ``memory_mb``: ``.environments[i].invoke(event)``."""
    return LambdaFleet(function, environment, memory_mb=memory_mb).start(count)
