"""cfn-lint with the serverless rules, informational checks included, on the template as written and as
transformed; ``sam validate --lint`` on every shape the parameters give the stack."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cfnlint.api import ManualArgs, lint

from testkit.template import REGION, REPO_ROOT, TEMPLATE_PATH, load_template
from tests.deployment.combinations import SHAPES, shape_id
from tests.deployment.lookups import event_source_mapping

_CONFIG = ManualArgs(regions=[REGION], include_checks=["I"], append_rules=["cfn_lint_serverless.rules"])
# ES1001 asks the generated event source mapping for an on-failure destination. Lambda supports none for SQS: a
# failed message goes back to the queue and, after MaxReceiveCount receives, to the dead-letter queue through the
# queue's RedrivePolicy. The template as written cannot carry a cfn-lint exception onto a resource SAM generates.
_TRANSFORMED_CONFIG = ManualArgs(**{**_CONFIG, "ignore_checks": ["ES1001"]})
SAM = REPO_ROOT / ".venv-sam" / "bin" / "sam"
LINT_SELF_CHECK = Path(__file__).parent / "fixtures" / "lint-self-check.yaml"
# make validate runs sam validate on the default shape (standard, on-demand) and cfn-lint reads both branches of
# every condition in the transformed template (the tests above); here, the shape where each takes its other branch.
STACK_SHAPES = [
    shape
    for shape in SHAPES
    if (shape["AlarmTopicArn"], shape["QueueType"], shape["EventSourceMode"]) == ("", "fifo", "provisioned")
]


def _findings(text: str, config: ManualArgs = _CONFIG) -> list[str]:
    return [f"{match.rule.id} {match.message} (line {match.linenumber})" for match in lint(text, config=config)]


def test_template_as_written_passes_cfn_lint() -> None:
    assert _findings(TEMPLATE_PATH.read_text(encoding="utf-8")) == []


def test_transformed_template_passes_cfn_lint(transformed_template: dict[str, Any]) -> None:
    assert "Transform" not in transformed_template
    assert _findings(json.dumps(transformed_template), _TRANSFORMED_CONFIG) == []


@pytest.mark.parametrize(
    ("original", "broken", "rule"),
    [
        # The tests above mean something only if lint() really reports problems...
        ("!GetAtt ConsumerDeadLetterQueue.Arn", "!GetAtt MissingQueue.Arn", "E1010"),
        # ...in the FIFO branch too, which the default parameters do not take...
        ("DeduplicationScope: !If [IsFifo, messageGroup,", "DeduplicationScope: !If [IsFifo, [messageGroup],", "E3012"),
        # ...and the serverless rules are loaded.
        ("            - WS1000\n", "", "WS1000"),
    ],
)
def test_lint_reports_a_broken_template(original: str, broken: str, rule: str) -> None:
    # On a fixed template, not template.yaml: a mistake of yours is the checks' above to name, and must neither break
    # this check of the linter nor make it pass on findings of its own.
    text = LINT_SELF_CHECK.read_text(encoding="utf-8")
    assert _findings(text) == []
    assert original in text
    assert [finding.split()[0] for finding in _findings(text.replace(original, broken, 1))] == [rule]


def test_lint_of_the_transformed_template_reports_a_broken_provisioned_branch(
    transformed_template: dict[str, Any],
) -> None:
    # cfn-lint checks the SAM event's pass-through properties only once transformed: this is where it sees them.
    broken = copy.deepcopy(transformed_template)
    mapping = event_source_mapping(broken)
    _, provisioned, _ = mapping["ProvisionedPollerConfig"]["Fn::If"]
    provisioned["MinimumPollers"] = 500
    assert any(finding.startswith("E3034") for finding in _findings(json.dumps(broken), _TRANSFORMED_CONFIG))


@pytest.mark.parametrize("shape", STACK_SHAPES, ids=shape_id)
def test_sam_validate_lint_passes_on_the_other_stack_shape(tmp_path: Path, shape: dict[str, Any]) -> None:
    if not SAM.exists():
        pytest.skip("SAM CLI is not installed (make validate installs it)")
    document = load_template()
    for name, value in shape.items():
        document["Parameters"][name]["Default"] = value
    copy = tmp_path / "template.yaml"
    copy.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    result = subprocess.run(
        [str(SAM), "validate", "--lint", "--region", REGION, "--template-file", str(copy)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SAM_CLI_TELEMETRY": "0"},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
