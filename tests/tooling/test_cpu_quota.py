"""Lambda's CPU share as a cgroup quota: the arithmetic, both cgroup layouts, and every refusal.

The cgroup trees here are directories the test builds, with the files the kernel would
show; the real quota is exercised through the runtime in tests/tooling.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit import cpu_quota
from testkit.cpu_quota import CpuQuotaUnavailable, cpu_share, create, quota_us


@pytest.mark.parametrize(
    ("memory_mb", "expected"), [(512, 28_943), (1024, 57_886), (1769, 100_000), (3538, 200_000), (10, 1_000)]
)
def test_the_quota_is_the_period_times_memory_over_1769_mb(memory_mb: int, expected: int) -> None:
    assert quota_us(memory_mb, 100_000) == expected


def test_512_mb_is_about_029_of_a_core() -> None:
    assert round(cpu_share(512), 2) == 0.29


@pytest.mark.parametrize("memory_mb", [0, -128])
def test_a_memory_size_that_is_not_positive_is_refused(memory_mb: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        cpu_share(memory_mb)


def v2_root(tmp_path: Path, controllers: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "cgroup.controllers").write_text(controllers, encoding="ascii")
    (tmp_path / "cgroup.subtree_control").write_text("", encoding="ascii")
    monkeypatch.setattr(cpu_quota, "_own_v2_group", lambda root: root)
    return tmp_path


def test_cgroup_v2_gets_cpu_max_and_the_controller_enabled_down_to_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = v2_root(tmp_path, "cpuset cpu io memory", monkeypatch)

    quota = create("env-1", 512, root)

    assert quota.path == root / cpu_quota.GROUP_NAME / "env-1"
    assert (quota.path / "cpu.max").read_text(encoding="ascii") == "28943 100000"
    assert (root / "cgroup.subtree_control").read_text(encoding="ascii") == "+cpu"
    assert (root / cpu_quota.GROUP_NAME / "cgroup.subtree_control").read_text(encoding="ascii") == "+cpu"
    assert quota.describe() == "CPU quota 28943/100000 us = 0.29 vCPU"


def test_a_process_joins_its_group_and_the_empty_group_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quota = create("env-2", 1024, v2_root(tmp_path, "cpu", monkeypatch))

    quota.add(4242)
    assert (quota.path / "cgroup.procs").read_text(encoding="ascii") == "4242"
    for child in quota.path.iterdir():
        child.unlink()  # the kernel's files vanish with the group; here the test plays the kernel
    quota.remove()

    assert not quota.path.exists()


def test_cgroup_v2_without_the_cpu_controller_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CpuQuotaUnavailable, match="cpu controller is not available"):
        create("env", 512, v2_root(tmp_path, "memory io", monkeypatch))


def test_cgroup_v1_gets_the_cfs_quota_against_its_period(tmp_path: Path) -> None:
    controller = tmp_path / "cpu"
    controller.mkdir()
    (controller / "cpu.cfs_quota_us").write_text("-1", encoding="ascii")
    group = controller / cpu_quota.GROUP_NAME / "env"
    group.mkdir(parents=True)
    (group / "cpu.cfs_period_us").write_text("50000\n", encoding="ascii")

    quota = create("env", 512, tmp_path)

    assert (quota.quota_us, quota.period_us) == (14_471, 50_000)
    assert (group / "cpu.cfs_quota_us").read_text(encoding="ascii") == "14471"


def test_cgroup_v1_without_a_readable_period_says_so(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1", encoding="ascii")

    with pytest.raises(CpuQuotaUnavailable, match="cannot read the CFS period"):
        create("env", 512, tmp_path)


def test_a_machine_without_a_cpu_controller_says_so(tmp_path: Path) -> None:
    with pytest.raises(CpuQuotaUnavailable, match="no cgroup cpu controller"):
        create("env", 512, tmp_path)


def test_a_group_that_cannot_be_written_says_which_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = v2_root(tmp_path, "cpu", monkeypatch)
    (root / "cgroup.subtree_control").unlink()
    (root / "cgroup.subtree_control").mkdir()  # a directory where the file should be: the write fails

    with pytest.raises(CpuQuotaUnavailable, match=r"cannot write .*cgroup.subtree_control"):
        create("env", 512, root)
