"""Lambda's CPU share for a local process: a cgroup CPU quota proportional to the memory size.

Lambda gives a function one vCPU at 1,769 MB, so the template's 512 MB gets about 0.29 of a core: without that share the
local runtime would run on a machine the function never gets. Each execution environment gets a cgroup of its own
(``cpu.max`` on v2, ``cpu.cfs_quota_us`` on v1), which the processes it starts inherit. Where the machine does not allow
it, ``CpuQuotaUnavailable`` says why in one line and the caller runs without a quota.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MB_PER_VCPU = 1769
CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_NAME = "idempotent-consumer-local"


class CpuQuotaUnavailable(RuntimeError):
    """This machine does not let us set a CPU quota."""


def cpu_share(memory_mb: int) -> float:
    if memory_mb <= 0:
        raise ValueError(f"memory size must be positive, got {memory_mb} MB")
    return memory_mb / MB_PER_VCPU


def quota_us(memory_mb: int, period_us: int) -> int:
    return max(1000, round(period_us * cpu_share(memory_mb)))


@contextlib.contextmanager
def _refused(action: str) -> Iterator[None]:
    try:
        yield
    except OSError as error:
        raise CpuQuotaUnavailable(f"cannot {action}: {error.strerror or error}") from error


def _write(path: Path, value: str) -> None:
    with _refused(f"write {path}"):
        path.write_text(value, encoding="ascii")


def _make_group(path: Path) -> Path:
    with _refused(f"create {path}"):
        path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class CpuQuota:
    """One cgroup with a CPU quota; ``add(pid)`` moves a process into it, ``remove()`` deletes it."""

    path: Path
    quota_us: int
    period_us: int

    def add(self, pid: int) -> None:
        _write(self.path / "cgroup.procs", str(pid))

    def remove(self) -> None:
        # Only an empty cgroup can be removed; its processes have exited by now.
        for group in (self.path, self.path.parent):
            with contextlib.suppress(OSError):
                group.rmdir()

    def describe(self) -> str:
        return f"CPU quota {self.quota_us}/{self.period_us} us = {self.quota_us / self.period_us:.2f} vCPU"


def _own_v2_group(root: Path) -> Path:
    # On v2, /proc/self/cgroup has one line "0::<path>"; our cgroup's children are ours to make.
    for line in Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines():
        if line.startswith("0::"):
            return root / line[3:].lstrip("/")
    return root


def create(name: str, memory_mb: int, root: Path = CGROUP_ROOT) -> CpuQuota:
    if (root / "cgroup.controllers").exists():
        base = _own_v2_group(root)
        if "cpu" not in (base / "cgroup.controllers").read_text(encoding="ascii").split():
            raise CpuQuotaUnavailable(f"the cpu controller is not available in {base}")
        # The controller must be enabled for the children at each level down to the leaf.
        _write(base / "cgroup.subtree_control", "+cpu")
        _write(_make_group(base / GROUP_NAME) / "cgroup.subtree_control", "+cpu")
        path, period = _make_group(base / GROUP_NAME / name), 100_000
        _write(path / "cpu.max", f"{quota_us(memory_mb, period)} {period}")
    elif (root / "cpu" / "cpu.cfs_quota_us").exists():
        path = _make_group(root / "cpu" / GROUP_NAME / name)
        try:
            period = int((path / "cpu.cfs_period_us").read_text(encoding="ascii"))
        except (OSError, ValueError) as error:
            raise CpuQuotaUnavailable(f"cannot read the CFS period of {path}: {error}") from error
        _write(path / "cpu.cfs_quota_us", str(quota_us(memory_mb, period)))
    else:
        raise CpuQuotaUnavailable(f"no cgroup cpu controller under {root}")
    return CpuQuota(path, quota_us(memory_mb, period), period)


def unique_name(label: str) -> str:
    return f"{label}-{os.getpid()}-{os.urandom(3).hex()}"
