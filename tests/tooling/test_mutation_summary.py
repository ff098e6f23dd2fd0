"""``make mutation``'s summary: the score per module, each survivor named, and the equivalents list held to the run.

The summary is the Makefile's own awk program, read from the Makefile and run on a results listing of mutmut's form.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from testkit.template import REPO_ROOT

_RESULTS = """\
    consumer.a.x_f__mutmut_1: killed
    consumer.a.x_f__mutmut_2: timeout
    consumer.a.x_f__mutmut_3: survived
    consumer.a.x_f__mutmut_4: survived
    consumer.a.x_f__mutmut_5: killed
    consumer.a.x_f__mutmut_6: not checked
"""


def _summary(tmp_path: Path, equivalents: str) -> subprocess.CompletedProcess[str]:
    recipe = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    found = re.search(r"awk -v equivalents=\$\(MUTATION_EQUIVALENTS\) '(.*?)'\n", recipe, re.DOTALL)
    assert found, "make mutation's summary is no longer an awk program of the Makefile: update this test"
    program = found.group(1).replace("$$", "$").replace("\\\n", "\n")
    listed = tmp_path / "equivalents.txt"
    listed.write_text(equivalents, encoding="utf-8")
    return subprocess.run(
        ["awk", "-v", f"equivalents={listed}", program],
        input=_RESULTS,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(
    ("equivalents", "score", "returncode"),
    [
        # Five checked, one equivalent: three of four killed (the timeout among them), under the 95% bar.
        ("consumer.a.x_f__mutmut_4  why it cannot be killed\n", "3 /    4 killed (75.0%), 1 equivalent", 1),
        ("consumer.a.x_f__mutmut_3  one\nconsumer.a.x_f__mutmut_4  two\n", "3 /    3 killed (100.0%), 2 equivalent", 0),
        # Killed by a test outside the fast selection, checked by hand: counted as killed.
        (
            "consumer.a.x_f__mutmut_3  killed by tests/x.py::t\nconsumer.a.x_f__mutmut_4  why\n",
            "4 /    4 killed (100.0%), 1 equivalent",
            0,
        ),
    ],
    ids=["a-survivor-unlisted", "every-survivor-listed", "killed-by-a-test-outside"],
)
def test_the_score_counts_each_survivor_listed_as_equivalent_or_killed_and_fails_under_95_percent(
    tmp_path: Path, equivalents: str, score: str, returncode: int
) -> None:
    run = _summary(tmp_path, equivalents)
    assert score in run.stdout
    assert run.returncode == returncode


def test_a_survivor_not_listed_is_named(tmp_path: Path) -> None:
    assert "  survived: consumer.a.x_f__mutmut_3" in _summary(tmp_path, "").stdout


def test_an_entry_whose_mutant_no_longer_survives_fails_the_run_and_is_named(tmp_path: Path) -> None:
    # A rewrite renumbers a function's mutants: an entry left naming a killed one counted it as equivalent, which
    # shrank the score's denominator and hid that the list no longer said why anything survived.
    equivalents = "consumer.a.x_f__mutmut_3  one\nconsumer.a.x_f__mutmut_4  two\nconsumer.a.x_f__mutmut_5  stale\n"
    run = _summary(tmp_path, equivalents)
    assert "listed as equivalent, yet killed (renumbered or killed: mend the list): consumer.a.x_f__mutmut_5" in (
        run.stdout
    )
    assert "3 /    3 killed (100.0%), 2 equivalent" in run.stdout
    assert run.returncode == 1
