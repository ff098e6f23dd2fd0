"""cfn-lint, informational checks included, on the template as written and as transformed."""

from __future__ import annotations

import json
from typing import Any

from cfnlint.api import ManualArgs, lint

from testkit.template import REGION, TEMPLATE_PATH

_CONFIG = ManualArgs(regions=[REGION], include_checks=["I"])


def _findings(text: str) -> list[str]:
    return [f"{match.rule.id} {match.message} (line {match.linenumber})" for match in lint(text, config=_CONFIG)]


def test_template_as_written_passes_cfn_lint() -> None:
    assert _findings(TEMPLATE_PATH.read_text(encoding="utf-8")) == []


def test_transformed_template_passes_cfn_lint(transformed_template: dict[str, Any]) -> None:
    assert "Transform" not in transformed_template
    assert _findings(json.dumps(transformed_template)) == []


def test_lint_reports_a_broken_template() -> None:
    # The two tests above mean something only if lint() really reports problems.
    text = TEMPLATE_PATH.read_text(encoding="utf-8")
    broken = text.replace("!GetAtt ConsumerDeadLetterQueue.Arn", "!GetAtt MissingQueue.Arn", 1)
    assert broken != text
    assert any(finding.startswith("E") for finding in _findings(broken))
