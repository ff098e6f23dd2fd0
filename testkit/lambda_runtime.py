"""The function in Lambda's own runtime: the Runtime Interface Emulator driving ``python -m awslambdaric``.

One ``LambdaEnvironment`` is one execution environment: the emulator ``sam local invoke`` runs (from SAM CLI's wheel)
and the runtime it starts on the function's Python 3.13 venv, with Lambda's variables and CPU share. On timeout the
emulator kills the runtime and the next invocation starts a new one (a real cold start, whose init, unlike Lambda, it
counts against Timeout). One invocation at a time, as Lambda's (two at once crash the emulator): ``LambdaFleet`` holds
one per concurrent invocation. They bind 127.0.0.1 only and stop by PID, or with a parent that dies.
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
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Self, TextIO

from testkit import cpu_quota
from testkit.aws import REGION
from testkit.invocation import FunctionError, Invocation
from testkit.lambda_venv import LAMBDA_PYTHON_VERSION, venv_python
from testkit.processes import LOOPBACK, ChildProcess, Lifecycle, ServerStartError, children, free_port, listening
from testkit.resources import FunctionSpec
from testkit.template import REPO_ROOT

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
_QUOTA_NOTED = threading.Lock()
# Handlers that started once in this process need no second check (the code does not change under us).
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
    arch = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    if arch is None:
        raise RuntimeStartError(f"the Lambda runtime emulator has no build for {platform.machine()}")
    rapid = "lib/python*/site-packages/samcli/local/rapid"
    found = sorted((REPO_ROOT / ".venv-sam").glob(f"{rapid}/aws-lambda-rie-{arch}"))
    if not found:
        raise RuntimeStartError(
            "the Lambda runtime emulator is missing: it comes with SAM CLI's wheel (run `make .venv-sam/.installed`)"
        )
    return found[-1]


def lambda_variables(function: FunctionSpec, python: Path) -> dict[str, str]:
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
    """Import the handler as the runtime would, then start it as Lambda's init does (a handler that has a start, as
    the consumer's has): a bad handler string, or a function that cannot start, fails before anything waits on it."""
    checked = (function.handler, str(function.code_dir), str(python))
    if checked in _handlers_checked:
        return
    module, _, attribute = function.handler.rpartition(".")
    probe = "import importlib, sys; handler = getattr(importlib.import_module(sys.argv[1]), sys.argv[2])"
    start = "print('imported', flush=True); getattr(handler, 'build_consumer', lambda: None)()"
    answer = subprocess.run(
        [str(python), "-c", f"{probe}; {start}", module or function.handler, attribute],
        cwd=function.code_dir,
        env={**environment, **lambda_variables(function, python), "PYTHONPATH": str(function.code_dir)},
        capture_output=True,
        text=True,
        check=False,
    )
    if answer.returncode != 0:
        cause = (answer.stderr.strip().splitlines() or [f"exit code {answer.returncode}"])[-1]
        if "imported" in answer.stdout.splitlines():
            raise RuntimeStartError(f"the function cannot start: {cause}")
        raise HandlerImportError(
            f"the handler {function.handler!r} does not import from {function.code_dir} "
            f"(Runtime.ImportModuleError): {cause}"
        )
    _handlers_checked.add(checked)


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: the kernel kills the emulator when the thread
    # that started it dies, so even a parent killed with SIGKILL leaves no emulator behind.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _port_taken(port: int | str) -> PortTaken:
    return PortTaken(f"port {LOOPBACK}:{port} is already in use: the Lambda runtime emulator cannot listen on it")


class LambdaEnvironment(Lifecycle):
    """One execution environment: emulator + runtime, one invocation at a time.

    ``emulator_port`` defaults to a free port (another is tried if it is taken meanwhile); given, a taken one is an
    error. ``log_sink`` receives what the environment logs during each invocation (the lines CloudWatch would hold).
    """

    def __init__(
        self,
        function: FunctionSpec,
        environment: Mapping[str, str],
        *,
        python: Path,
        name: str = "env",
        emulator_port: int | None = None,
        log_sink: TextIO | None = None,
    ) -> None:
        self.function = function
        self.name = name
        self._environment = {**environment, **lambda_variables(function, python)}
        self._python = python
        self._emulator_port = emulator_port
        self._log_sink = log_sink
        self._lock = threading.Lock()
        self._emulator: ChildProcess | None = None
        self.quota: cpu_quota.CpuQuota | None = None
        self.port: int | None = None
        self.cold_starts = 0

    @property
    def pid(self) -> int | None:
        return self._emulator.pid if self._emulator else None

    def start(self) -> Self:
        if self._emulator_port is None:
            for _ in range(_START_ATTEMPTS - 1):
                with contextlib.suppress(PortTaken):
                    return self._start_once()
        return self._start_once()

    def _start_once(self) -> Self:
        port, api_port = self._emulator_port or free_port(), free_port()
        for taken in (port, api_port):
            # Another listener on the port would answer our readiness probe: refuse it up front.
            if listening(taken):
                raise _port_taken(taken)
        emulator_address = ["--runtime-interface-emulator-address", f"{LOOPBACK}:{port}"]
        api_address = ["--runtime-api-address", f"{LOOPBACK}:{api_port}"]
        runtime = [str(self._python), "-m", "awslambdaric", self.function.handler]
        emulator = ChildProcess(
            f"lambda-{self.name}",
            [str(emulator_binary()), *emulator_address, *api_address, *runtime],
            cwd=self.function.code_dir,
            env=self._environment,
            preexec_fn=_die_with_parent,
        )
        self._emulator, self.port = emulator, port
        with self._stopped_on_failure():
            try:
                self._apply_cpu_share(emulator.pid)
                emulator.wait_until(lambda: listening(port), _START_TIMEOUT_S)
            except ServerStartError as failure:
                # Read before the stop removes the emulator's log.
                taken_port = _PORT_TAKEN.search(emulator.log())
                if taken_port:
                    raise _port_taken(taken_port.group(1)) from None
                raise RuntimeStartError(f"the Lambda runtime emulator did not start: {failure}") from None
        return self

    def _apply_cpu_share(self, pid: int) -> None:
        # The emulator starts the runtime on the first invocation, so the runtime inherits the cgroup.
        try:
            self.quota = cpu_quota.create(cpu_quota.unique_name(self.name), self.function.memory_mb)
            self.quota.add(pid)
        except cpu_quota.CpuQuotaUnavailable as unavailable:
            if self.quota is not None:
                self.quota.remove()
                self.quota = None
            # One line per process, whatever the number of environments: the lock is taken once, never released.
            if _QUOTA_NOTED.acquire(blocking=False):
                note = f"note: Lambda's CPU share not applied ({unavailable}): the function gets the whole CPU"
                print(note, file=sys.stderr)

    def invoke(self, event: dict[str, Any]) -> Invocation:
        """One invocation, as Lambda's Invoke API would run it; one at a time per environment."""
        payload = json.dumps(event).encode()
        with self._lock:
            emulator = self._emulator
            if emulator is None:
                raise RuntimeError(f"the execution environment {self.name} is not running")
            emulator.new_output()  # what was logged between invocations is not this one's
            started = time.monotonic()
            status, body = self._post(emulator, payload)
            duration_s = time.monotonic() - started
            logged = emulator.new_output()
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

    def _post(self, emulator: ChildProcess, payload: bytes) -> tuple[int, bytes]:
        timeout_s = self.function.timeout_s + _ANSWER_SLACK_S
        connection = http.client.HTTPConnection(LOOPBACK, self.port, timeout=timeout_s)
        try:
            connection.request("POST", INVOKE_PATH, body=payload, headers={"Content-Type": "application/json"})
            answer = connection.getresponse()
            return answer.status, answer.read()
        except (OSError, http.client.HTTPException) as error:
            code = emulator.process.poll()
            if code is not None:
                raise EmulatorExited(
                    f"the Lambda runtime emulator of {self.name} (pid {emulator.pid}) exited with code "
                    f"{code}: {emulator.last_line()}"
                ) from error
            raise EmulatorExited(f"the Lambda runtime emulator of {self.name} did not answer: {error}") from error
        finally:
            connection.close()

    def stop(self) -> None:
        """Stop the emulator (it stops its runtime), then anything of ours it left; safe to call twice."""
        emulator, self._emulator, self.port = self._emulator, None, None
        if emulator is not None:
            runtime = children(emulator.pid) if emulator.process.poll() is None else []
            emulator.stop()
            for pid in runtime:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.quota is not None:
            self.quota.remove()
            self.quota = None


def _parse_answer(status: int, body: bytes) -> tuple[Any, BaseException | None]:
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


class LambdaFleet(Lifecycle):
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
        log_sink: TextIO | None = None,
    ) -> None:
        self.function = replace(function, memory_mb=memory_mb) if memory_mb else function
        self.environment = dict(environment)
        self.log_sink = log_sink
        python = venv_python()
        check_handler(self.function, self.environment, python)
        self._new = partial(LambdaEnvironment, self.function, self.environment, python=python, log_sink=log_sink)
        self._names = itertools.count()
        self.environments: list[LambdaEnvironment] = []

    def start(self) -> Self:
        return self  # each environment starts as ``add`` makes it

    def add(self) -> LambdaEnvironment:
        environment = self._new(name=f"env-{next(self._names)}").start()
        self.environments.append(environment)
        return environment

    def stop(self) -> None:
        environments, self.environments = self.environments, []
        for environment in environments:
            environment.stop()
