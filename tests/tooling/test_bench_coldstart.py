"""The cold-start measurement's arithmetic and the build step whose artifact it starts from."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.coldstart import CONSUMER, FLOOR, FULL_CPU, POWERTOOLS, ColdStarts, import_groups
from bench.report import TIMES, cold_start_targets
from testkit import application
from testkit.lambda_venv import LAMBDA_PYTHON_VERSION, LambdaPythonMissing, find_python
from testkit.template import REPO_ROOT, load_template

# What build-ConsumerFunction ships (the Makefile's FUNCTION_PACKAGES).
PACKAGES = ("consumer", application.PACKAGE)

IMPORTTIME = """import time: self [us] | cumulative | imported package
import time:      5000 |       5000 | testkit.lambda_sqs
started
import time:      2000 |       2000 |     botocore.session
import time:      1500 |       1500 |     pydantic.main
import time:       500 |       2000 |   pydantic
import time:      3000 |       6500 | consumer.app
initialised
import time:      9000 |       9000 | concurrent.futures.thread
"""


def test_import_groups_sum_the_inits_own_time_by_package_and_put_the_floors_modules_together() -> None:
    groups = import_groups(IMPORTTIME, floor_modules={"botocore.session", "testkit.lambda_sqs"})
    # The driver's imports before "started" and the first invocation's after "initialised" are not the init's.
    assert groups == {"imported by the floor too": 2.0, "pydantic": 2.0, "consumer": 3.0}


def _starts(totals: dict[tuple[int, str], float]) -> ColdStarts:
    starts = ColdStarts()
    for key, total in totals.items():
        starts.init_s[key] += [total * 0.75, total * 0.75, 10.0]  # the median of three, whatever the outlier
        starts.first_s[key] += [total * 0.25, total * 0.25, 0.0]
    return starts


def test_a_cold_start_is_each_process_init_plus_its_first_invocation() -> None:
    starts = ColdStarts()
    starts.init_s[FULL_CPU, CONSUMER] += [0.3, 0.5]
    starts.first_s[FULL_CPU, CONSUMER] += [0.1, 0.2]
    assert starts.total_s(FULL_CPU, CONSUMER) == pytest.approx([0.4, 0.7])


def test_the_verdicts_compare_with_powertools_at_each_share_and_with_the_floor_at_full_cpu() -> None:
    starts = _starts(
        {
            (FULL_CPU, CONSUMER): 0.40,
            (FULL_CPU, POWERTOOLS): 0.50,
            (FULL_CPU, FLOOR): 0.30,
            (512, CONSUMER): 1.60,
            (512, POWERTOOLS): 1.50,
            (512, FLOOR): 1.00,
        }
    )
    full, share = cold_start_targets(starts)
    assert full.startswith("- **met**: cold start, full CPU") and f"**missed**: 1.33{TIMES} the botocore floor" in full
    assert share.startswith("- **missed**: cold start, 512 MB") and "floor" not in share


def _lambda_python() -> Path:
    try:
        return find_python()
    except LambdaPythonMissing as error:
        pytest.skip(str(error))


def test_the_build_step_installs_for_the_templates_architecture() -> None:
    planned = subprocess.run(
        ["make", "-n", "-f", str(REPO_ROOT / "Makefile"), "build-ConsumerFunction", "ARTIFACTS_DIR=/nowhere"],
        cwd=REPO_ROOT / "src",
        capture_output=True,
        text=True,
        check=True,
        env={key: value for key, value in os.environ.items() if key != "FUNCTION_ARCH"},
    ).stdout
    assert "--platform manylinux2014_aarch64" in planned  # template.yaml: Architectures: [arm64]
    assert "-r requirements.txt" in planned


def test_the_build_step_ships_hash_checked_bytecode_for_every_module(tmp_path: Path) -> None:
    python = _lambda_python()
    source = tmp_path / "src"
    for package in PACKAGES:
        shutil.copytree(REPO_ROOT / "src" / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    (source / "requirements.txt").write_text("# the dependencies are not what this test is about\n")
    stale = source / "consumer" / "__pycache__" / f"app.cpython-{LAMBDA_PYTHON_VERSION.replace('.', '')}.pyc"
    stale.parent.mkdir()
    stale.write_bytes(importlib.util.MAGIC_NUMBER + b"\0" * 12)  # timestamp-checked, as a checkout's cache is
    artifact = tmp_path / "artifact"
    subprocess.run(
        ["make", "-s", "-f", str(REPO_ROOT / "Makefile"), "build-ConsumerFunction", f"ARTIFACTS_DIR={artifact}"],
        cwd=source,
        capture_output=True,
        check=True,
        env={**os.environ, "PATH": f"{python.parent}:{os.environ['PATH']}", "FUNCTION_ARCH": "x86_64"},
    )
    modules = sorted(module for package in PACKAGES for module in (artifact / package).rglob("*.py"))
    assert len(modules) == sum(len(list((REPO_ROOT / "src" / package).rglob("*.py"))) for package in PACKAGES)
    # The module the template's Handler names is in the artifact (it was not: the function failed at its first start).
    handler_module = load_template()["Resources"]["ConsumerFunction"]["Properties"]["Handler"].rsplit(".", 1)[0]
    assert (artifact / f"{handler_module.replace('.', '/')}.py") in modules
    for module in modules:
        (cached,) = (module.parent / "__pycache__").glob(f"{module.stem}.cpython-*.pyc")
        flags = int.from_bytes(cached.read_bytes()[4:8], "little")
        assert flags == 0b11, f"{cached}: not checked-hash bytecode (flags {flags:#b})"  # PEP 552: hash, checked
