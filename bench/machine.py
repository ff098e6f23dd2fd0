"""The machine and versions a run measured on, for the report's header."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

_PACKAGES = ("boto3", "botocore", "moto", "aws-lambda-powertools", "pydantic")


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load_average() -> float:
    """Runnable processes, 1-minute average: above the CPU count, other work shared the machine."""
    return os.getloadavg()[0]


def describe_machine(dynamodb_local_version: str | None, loads: tuple[float, float]) -> dict[str, str]:
    facts = {
        "CPUs usable (nproc)": str(_usable_cpus()),
        "load average (1 min) at start / end of the run": f"{loads[0]:.2f} / {loads[1]:.2f}",
        "CPU model": _cpu_model(),
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
    }
    for package in _PACKAGES:
        facts[package] = metadata.version(package)
    facts["DynamoDB Local"] = dynamodb_local_version or "not run"
    return facts
