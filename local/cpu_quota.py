"""Lambda's CPU share for a local process: a cgroup CPU quota proportional to the memory size.

Lambda gives a function CPU in proportion to its memory, one vCPU at 1,769 MB, so the
template's 512 MB gets about 0.29 of a core. Without that share the local runtime would
run on a machine the function never gets. Each execution environment gets a cgroup of
its own under ``idempotent-consumer-local/``: ``cpu.max`` on cgroup v2,
``cpu.cfs_quota_us`` on v1, quota = period x MB / 1769. The processes it starts inherit
it. Where the machine does not allow it (no root, no cpu controller), ``CpuQuotaUnavailable``
says why in one line and the caller runs without a quota.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

MB_PER_VCPU = 1769
CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_NAME = "idempotent-consumer-local"


class CpuQuotaUnavailable(RuntimeError):
    """This machine does not let us set a CPU quota."""


def cpu_share(memory_mb: int) -> float:
    """The vCPUs Lambda gives a function of ``memory_mb``."""
    if memory_mb <= 0:
        raise ValueError(f"memory size must be positive, got {memory_mb} MB")
    return memory_mb / MB_PER_VCPU


def quota_us(memory_mb: int, period_us: int) -> int:
    """The CPU time per period that is ``cpu_share(memory_mb)`` of one core."""
    return max(1000, round(period_us * cpu_share(memory_mb)))


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value, encoding="ascii")
    except OSError as error:
        raise CpuQuotaUnavailable(f"cannot write {path}: {error.strerror or error}") from error


@dataclass(frozen=True)
class CpuQuota:
    """One cgroup with a CPU quota; ``add(pid)`` moves a process into it, ``remove()`` deletes it."""

    path: Path
    memory_mb: int
    quota_us: int
    period_us: int

    def add(self, pid: int) -> None:
        _write(self.path / "cgroup.procs", str(pid))

    def remove(self) -> None:
        # Only an empty cgroup can be removed; its processes have exited by now.
        with contextlib.suppress(OSError):
            self.path.rmdir()
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()

    def describe(self) -> str:
        return f"CPU quota {self.quota_us}/{self.period_us} us = {self.quota_us / self.period_us:.2f} vCPU"


def _own_v2_group(root: Path) -> Path:
    # On v2, /proc/self/cgroup has one line "0::<path>"; our cgroup's children are ours to make.
    for line in Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines():
        if line.startswith("0::"):
            return root / line[3:].lstrip("/")
    return root


def create(name: str, memory_mb: int, root: Path = CGROUP_ROOT) -> CpuQuota:
    """A new cgroup ``name`` limited to Lambda's share for ``memory_mb``."""
    if (root / "cgroup.controllers").exists():
        return _create_v2(_own_v2_group(root), name, memory_mb)
    if (root / "cpu" / "cpu.cfs_quota_us").exists():
        return _create_v1(root / "cpu", name, memory_mb)
    raise CpuQuotaUnavailable(f"no cgroup cpu controller under {root}")


def _make_group(parent: Path, name: str) -> Path:
    path = parent / GROUP_NAME / name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CpuQuotaUnavailable(f"cannot create {path}: {error.strerror or error}") from error
    return path


def _create_v1(controller: Path, name: str, memory_mb: int) -> CpuQuota:
    path = _make_group(controller, name)
    try:
        period = int((path / "cpu.cfs_period_us").read_text(encoding="ascii"))
    except (OSError, ValueError) as error:
        raise CpuQuotaUnavailable(f"cannot read the CFS period of {path}: {error}") from error
    quota = quota_us(memory_mb, period)
    _write(path / "cpu.cfs_quota_us", str(quota))
    return CpuQuota(path, memory_mb, quota, period)


def _create_v2(base: Path, name: str, memory_mb: int) -> CpuQuota:
    if "cpu" not in (base / "cgroup.controllers").read_text(encoding="ascii").split():
        raise CpuQuotaUnavailable(f"the cpu controller is not available in {base}")
    # The controller must be enabled for the children at each level down to the leaf.
    _write(base / "cgroup.subtree_control", "+cpu")
    group = base / GROUP_NAME
    group.mkdir(exist_ok=True)
    _write(group / "cgroup.subtree_control", "+cpu")
    path = _make_group(base, name)
    period = 100_000
    quota = quota_us(memory_mb, period)
    _write(path / "cpu.max", f"{quota} {period}")
    return CpuQuota(path, memory_mb, quota, period)


def unique_name(label: str) -> str:
    """A cgroup name no other process of ours uses."""
    return f"{label}-{os.getpid()}-{os.urandom(3).hex()}"
