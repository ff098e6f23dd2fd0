"""The GitHub Actions workflows, read as files: they run the commands README and docs/deploying.md give, every
action from outside this repository is pinned to a commit, credentials come from OIDC alone and no job can write
more than it needs; the stages of samconfig.toml and the deploy role agree with them. Each check is also shown
failing on a planted mistake, so that a check that can no longer fail does not pass unnoticed."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cfnlint
import pytest
import yaml
from cfnlint.api import ManualArgs, lint

from testkit.template import REPO_ROOT, load_template
from tests.deployment.lookups import SAMCONFIG_PATH

WORKFLOWS = REPO_ROOT / ".github" / "workflows"
ACTIONS = REPO_ROOT / ".github" / "actions"
README = REPO_ROOT / "README.md"
DEPLOYING = REPO_ROOT / "docs" / "deploying.md"
CI_SCRIPT = REPO_ROOT / ".ci" / "run"
DEPLOY_ROLE = REPO_ROOT / "pipeline" / "deploy-role.yaml"
STAGES = ("dev", "prod")
# owner/repo[/path]@<40 hex digits>: a tag or a branch can be moved to other code, a commit cannot.
PINNED = re.compile(r"[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}")
# Inputs through which an action would take stored keys instead of an OIDC token.
STORED_KEY_INPUTS = {"aws-access-key-id", "aws-secret-access-key", "aws-session-token"}
OIDC_ACTION = "aws-actions/configure-aws-credentials"


def _load(path: Path) -> dict[str, Any]:
    return _parse(path.read_text(encoding="utf-8"))


def _parse(text: str) -> dict[str, Any]:
    document = yaml.safe_load(text)
    # YAML 1.1 reads the key "on" as True.
    if True in document:
        document["on"] = document.pop(True)
    return dict(document)


def _files() -> dict[str, dict[str, Any]]:
    paths = [*sorted(WORKFLOWS.glob("*.yml")), *sorted(ACTIONS.glob("*/action.yml"))]
    return {str(path.relative_to(REPO_ROOT)): _load(path) for path in paths}


def _steps(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from document.get("runs", {}).get("steps", [])
    for job in document.get("jobs", {}).values():
        yield from job.get("steps", [])


def _uses(document: dict[str, Any]) -> list[str]:
    """Every action and reusable workflow a workflow or composite action names."""
    named = [step["uses"] for step in _steps(document) if "uses" in step]
    return named + [job["uses"] for job in document.get("jobs", {}).values() if "uses" in job]


def unpinned(document: dict[str, Any]) -> list[str]:
    """What comes from outside this repository without a commit SHA (a local ./ path is this very commit's)."""
    return [uses for uses in _uses(document) if not uses.startswith("./") and not PINNED.fullmatch(uses)]


def _permission_sets(document: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    if "jobs" in document:
        yield "workflow", document.get("permissions")
    for name, job in document.get("jobs", {}).items():
        yield name, job.get("permissions")


def excessive_permissions(document: dict[str, Any]) -> list[str]:
    """The workflow's default must be no permission at all; a job may read, and write nothing but id-token."""
    found = []
    for owner, permissions in _permission_sets(document):
        if owner == "workflow" and permissions != {}:
            found.append(f"workflow: {permissions!r} (the default must be {{}})")
        elif owner != "workflow" and not isinstance(permissions, dict):
            found.append(f"{owner}: {permissions!r} (each job names its permissions)")
        elif owner != "workflow":
            found += [f"{owner}: {k}: {v}" for k, v in permissions.items() if v != "read" and k != "id-token"]
    return found


def stored_keys(document: dict[str, Any]) -> list[str]:
    """Long-lived credentials: stored AWS keys given to an action, or any AWS secret read."""
    found = [
        f"{step['uses']}: {name}"
        for step in _steps(document)
        for name in step.get("with", {})
        if name in STORED_KEY_INPUTS
    ]
    return found + re.findall(r"secrets\.AWS_\w+", yaml.safe_dump(document))


def _run_lines(document: dict[str, Any]) -> list[str]:
    return [line.strip() for step in _steps(document) for line in str(step.get("run", "")).splitlines()]


@pytest.fixture(scope="module")
def files() -> dict[str, dict[str, Any]]:
    return _files()


@pytest.fixture(scope="module")
def samconfig() -> dict[str, Any]:
    return tomllib.loads(SAMCONFIG_PATH.read_text(encoding="utf-8"))


def test_there_are_workflows_to_check(files: dict[str, dict[str, Any]]) -> None:
    assert {".github/workflows/ci.yml", ".github/workflows/deploy.yml", ".github/workflows/stage.yml"} <= set(files)
    assert all(_uses(document) for document in files.values())


def test_every_action_from_outside_is_pinned_to_a_commit(files: dict[str, dict[str, Any]]) -> None:
    assert {path: unpinned(document) for path, document in files.items() if unpinned(document)} == {}


@pytest.mark.parametrize(
    "planted",
    [
        "actions/checkout@v7",
        "actions/checkout@main",
        "actions/checkout@3d3c42e",  # a short SHA can be matched by a new commit pushed to a fork
        "aws-actions/configure-aws-credentials",
    ],
)
def test_an_unpinned_action_is_found(planted: str) -> None:
    text = (WORKFLOWS / "ci.yml").read_text(encoding="utf-8")
    pinned = "actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1"
    assert pinned in text
    assert unpinned(_parse(text.replace(pinned, planted, 1))) == [planted]


def test_no_job_writes_but_an_oidc_token(files: dict[str, dict[str, Any]]) -> None:
    assert {path: excessive_permissions(d) for path, d in files.items() if excessive_permissions(d)} == {}


@pytest.mark.parametrize(
    ("original", "planted"),
    [
        ("    permissions:\n      contents: read\n", "    permissions:\n      contents: write\n"),
        ("    permissions:\n      contents: read\n", "    permissions: write-all\n"),
        ("permissions: {}\n", "permissions: read-all\n"),
    ],
)
def test_a_write_permission_is_found(original: str, planted: str) -> None:
    text = (WORKFLOWS / "ci.yml").read_text(encoding="utf-8")
    assert original in text
    assert excessive_permissions(_parse(text.replace(original, planted, 1)))


def test_credentials_come_from_oidc_alone(files: dict[str, dict[str, Any]]) -> None:
    assert {path: stored_keys(document) for path, document in files.items() if stored_keys(document)} == {}
    stage = files[".github/workflows/stage.yml"]
    [job] = stage["jobs"].values()
    assert job["permissions"]["id-token"] == "write"
    [assume] = [step for step in job["steps"] if step.get("uses", "").startswith(OIDC_ACTION)]
    assert assume["with"]["role-to-assume"] == "${{ vars.AWS_DEPLOY_ROLE_ARN }}"
    # Only the jobs that deploy may ask for an OIDC token.
    requesting = {
        f"{path}:{name}"
        for path, document in files.items()
        for name, job in document.get("jobs", {}).items()
        if (job.get("permissions") or {}).get("id-token") == "write"
    }
    assert requesting == {".github/workflows/stage.yml:deploy", *(f".github/workflows/deploy.yml:{s}" for s in STAGES)}


def test_stored_keys_are_found() -> None:
    text = (WORKFLOWS / "stage.yml").read_text(encoding="utf-8")
    original = "          role-to-assume: ${{ vars.AWS_DEPLOY_ROLE_ARN }}\n"
    planted = "          aws-access-key-id: ${{ secrets.AWS_ACCESS_KEY_ID }}\n"
    assert original in text
    found = stored_keys(_parse(text.replace(original, planted, 1)))
    assert found == [
        f"{OIDC_ACTION}@e6de054238d6b7531b4efff3b6587d9aade6a06c: aws-access-key-id",
        "secrets.AWS_ACCESS_KEY_ID",
    ]


def test_ci_runs_the_readmes_commands_as_ci_does(files: dict[str, dict[str, Any]]) -> None:
    commands = _run_lines(files[".github/workflows/ci.yml"])
    script = [line for line in CI_SCRIPT.read_text(encoding="utf-8").splitlines() if line.startswith("make ")]
    assert commands == script == ["make test", "make proof", "make rehearse"]
    readme = README.read_text(encoding="utf-8")
    # Each as a command of its own: at the start of a line of a code block, or in backticks.
    assert all(re.search(rf"(^|`){command}(\s|`)", readme, re.MULTILINE) for command in commands)
    ci = files[".github/workflows/ci.yml"]["on"]
    assert {"pull_request", "push", "workflow_call"} <= set(ci)


def test_a_push_to_main_is_tested_then_deployed_to_dev_then_prod(files: dict[str, dict[str, Any]]) -> None:
    deploy = files[".github/workflows/deploy.yml"]
    assert deploy["on"]["push"]["branches"] == ["main"]
    assert "workflow_dispatch" in deploy["on"]
    jobs = deploy["jobs"]
    assert jobs["checks"]["uses"] == "./.github/workflows/ci.yml"
    assert (jobs["dev"]["needs"], jobs["prod"]["needs"]) == ("checks", "dev")
    assert all(jobs[stage]["uses"] == "./.github/workflows/stage.yml" for stage in STAGES)
    assert [jobs[stage]["with"]["stage"] for stage in STAGES] == list(STAGES)
    # Skipping dev skips prod: a run by hand of another branch never reaches a stage.
    assert jobs["dev"]["if"] == "github.ref == 'refs/heads/main'"


def test_a_stage_deploys_with_the_documented_commands_one_at_a_time(files: dict[str, dict[str, Any]]) -> None:
    [job] = files[".github/workflows/stage.yml"]["jobs"].values()
    # The GitHub environment of the stage's name: its reviewers guard prod, its variables name the stage's role.
    assert job["environment"] == "${{ inputs.stage }}"
    assert job["concurrency"] == {"group": "deploy-${{ inputs.stage }}", "cancel-in-progress": False}
    lines = _run_lines(files[".github/workflows/stage.yml"])
    [deploy] = [line for line in lines if line.startswith("make deploy ")]
    assert deploy.startswith('make deploy STAGE="$STAGE" PARAMETERS=')
    arguments = " ".join(lines[lines.index(deploy) :])
    assert "--no-confirm-changeset" in arguments
    assert "--role-arn $CLOUDFORMATION_ROLE_ARN" in arguments
    assert 'make smoke STACK="$STACK" REGION="$REGION"' in lines
    assert job["env"]["STACK"] == "idempotent-sqs-consumer-${{ inputs.stage }}"
    page = DEPLOYING.read_text(encoding="utf-8")
    assert "make deploy STAGE=dev" in page
    assert "make smoke STACK=" in page


def _run_deploy_step(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The stage's deploy step as its runner runs it, with a ``make`` that prints its arguments instead."""
    [step] = [s for s in _steps(_load(WORKFLOWS / "stage.yml")) if "make deploy" in s.get("run", "")]
    fake = tmp_path / "make"
    fake.write_text('#!/bin/sh\nfor argument in "$@"; do echo "$argument"; done\n', encoding="utf-8")
    fake.chmod(0o755)
    environment = {"PATH": f"{tmp_path}:/usr/bin:/bin", "REGION": "eu-west-1", "CLOUDFORMATION_ROLE_ARN": "arn:r"}
    # GitHub's own shell for a run step: bash -e.
    return subprocess.run(
        ["bash", "-e", "-c", step["run"]], env=environment | env, capture_output=True, text=True, check=False
    )


def test_a_stage_passes_its_environments_own_parameters_and_names_none_of_a_handlers(tmp_path: Path) -> None:
    given = "ExistingOrdersTable=orders-dev BillingUrl=https://billing.example/v1?x=1"
    ran = _run_deploy_step(tmp_path, STAGE="dev", ALARM_TOPIC_ARN="arn:aws:sns:eu-west-1:1:t", STACK_PARAMETERS=given)
    assert ran.returncode == 0, ran.stderr
    assert f"PARAMETERS=AlarmTopicArn=arn:aws:sns:eu-west-1:1:t {given}" in ran.stdout.splitlines()
    bare = _run_deploy_step(tmp_path, STAGE="dev", ALARM_TOPIC_ARN="", STACK_PARAMETERS="")
    assert "PARAMETERS=" in bare.stdout.splitlines()
    refused = _run_deploy_step(tmp_path, STAGE="prod", ALARM_TOPIC_ARN="", STACK_PARAMETERS=given)
    assert refused.returncode == 1
    assert "prod needs the ALARM_TOPIC_ARN variable" in refused.stdout


def test_the_stages_are_samconfig_environments_a_person_confirms(samconfig: dict[str, Any]) -> None:
    names = []
    for stage in STAGES:
        settings = {**samconfig[stage]["global"]["parameters"], **samconfig[stage]["deploy"]["parameters"]}
        names.append(settings["stack_name"])
        assert settings["stack_name"] == f"idempotent-sqs-consumer-{stage}"
        # The deploy role's artifact grant is on this prefix: the stack's own name.
        assert settings["s3_prefix"] == settings["stack_name"]
        assert settings["confirm_changeset"] is True  # the pipeline alone passes --no-confirm-changeset
        assert settings["resolve_s3"] is True
        assert settings["capabilities"] == "CAPABILITY_IAM"
        assert all(re.fullmatch(r"[A-Za-z]+=\S+", item) for item in settings["parameter_overrides"])
    assert len(set(names)) == len(STAGES)


def _role_statements(role: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for policy in role["Properties"]["Policies"] for s in policy["PolicyDocument"]["Statement"]]


def test_the_deploy_role_is_assumed_by_this_stages_environment_alone() -> None:
    role = load_template(DEPLOY_ROLE)["Resources"]["DeployRole"]
    [trust] = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Action"] == "sts:AssumeRoleWithWebIdentity"
    conditions = trust["Condition"]["StringEquals"]
    assert conditions["token.actions.githubusercontent.com:aud"] == "sts.amazonaws.com"
    assert conditions["token.actions.githubusercontent.com:sub"] == {
        "Fn::Sub": "repo:${Repository}:environment:${Stage}"
    }
    assert "StringLike" not in trust["Condition"]  # no wildcard subject


def test_the_deploy_roles_grants_name_the_stages_stack() -> None:
    resources = load_template(DEPLOY_ROLE)["Resources"]
    statements = _role_statements(resources["DeployRole"]) + _role_statements(resources["CloudFormationExecutionRole"])
    # Every grant but these names the stage's resources (<ServiceName>-<Stage>), or one role or one transform.
    unscoped = {
        "EventSourceMapping",
        "EventSourceMappingTags",
        "Dashboard",
        "FindTheLogGroup",
        "FindSamsManagedBucket",
        "UseTheSamTransform",
    }
    for statement in statements:
        if statement["Sid"] in unscoped or "Fn::GetAtt" in statement["Resource"]:
            continue
        # On the resource's name, or for a bucket listed, on the prefix it may list.
        scope = statement["Resource"]["Fn::Sub"] + str(statement.get("Condition", {}).get("StringLike", {}))
        assert "${ServiceName}-${Stage}" in scope, statement["Sid"]
    [mapping] = [s for s in statements if s["Sid"] == "EventSourceMapping"]
    assert "${ServiceName}-${Stage}-*" in mapping["Condition"]["StringLike"]["lambda:FunctionArn"]["Fn::Sub"]
    assert all(statement["Effect"] == "Allow" and "*" not in statement["Action"] for statement in statements)


def _role_findings(text: str) -> list[str]:
    return [f"{m.rule.id} {m.message}" for m in lint(text, config=ManualArgs(regions=["us-east-1"]))]


def test_the_deploy_role_passes_cfn_lint_which_sees_a_mistake() -> None:
    text = DEPLOY_ROLE.read_text(encoding="utf-8")
    assert _role_findings(text) == []
    assert "- lambda:GetFunctionConfiguration\n" in text
    assert _role_findings(text.replace("- lambda:GetFunctionConfiguration\n", "- lambda:GetFunctionConfig\n", 1))


# What CloudFormation reads each resource back with: the read handler's permissions in the resource type's schema
# (cfn-lint ships the schemas). kms:Decrypt is left out: the function and the event source mapping need it only for
# a customer managed key (KmsKeyArn, a filter's key), which neither has.
CUSTOMER_KEY_ONLY = {"kms:Decrypt"}


def _read_handler_permissions(resource_type: str) -> set[str]:
    schemas = Path(cfnlint.__file__).parent / "data" / "schemas"
    providers = json.loads((schemas / "providers" / "us-east-1.json").read_text(encoding="utf-8"))
    schema = json.loads((schemas / "resources" / f"{providers[resource_type]}.json").read_text(encoding="utf-8"))
    return set(schema["handlers"].get("read", {}).get("permissions", [])) - CUSTOMER_KEY_ONLY


def unreadable(role_template: dict[str, Any], resource_types: set[str]) -> dict[str, list[str]]:
    """Per resource type of the stack, what CloudFormation's role lacks to read it back."""
    statements = _role_statements(role_template["Resources"]["CloudFormationExecutionRole"])
    granted = {
        action for s in statements for action in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    missing = {kind: sorted(_read_handler_permissions(kind) - granted) for kind in sorted(resource_types)}
    return {kind: actions for kind, actions in missing.items() if actions}


def test_cloudformations_role_can_read_back_every_resource_of_the_stack(transformed_template: dict[str, Any]) -> None:
    kinds = {body["Type"] for body in transformed_template["Resources"].values()}
    assert unreadable(load_template(DEPLOY_ROLE), kinds) == {}


def test_a_missing_read_permission_is_found(transformed_template: dict[str, Any], tmp_path: Path) -> None:
    text = DEPLOY_ROLE.read_text(encoding="utf-8")
    assert "                  - dynamodb:DescribeTimeToLive\n" in text
    planted = tmp_path / "deploy-role.yaml"
    planted.write_text(text.replace("                  - dynamodb:DescribeTimeToLive\n", "", 1), encoding="utf-8")
    kinds = {body["Type"] for body in transformed_template["Resources"].values()}
    assert unreadable(load_template(planted), kinds) == {"AWS::DynamoDB::Table": ["dynamodb:DescribeTimeToLive"]}
