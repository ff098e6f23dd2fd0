"""The pipeline's deploy role (pipeline/deploy-role.yaml) deployed as docs/deploying.md says, per stage, onto the
emulator ``make rehearse`` uses (``make rehearse`` runs this module after the stack's rehearsal). The emulator's
CloudFormation has no AWS::IAM::OIDCProvider, so the provider is created through its IAM API and passed as an
existing one (``OidcProviderArn``): the template's branch that creates it is checked by cfn-lint alone. The emulator
cannot show that the grants suffice for ``sam deploy`` on AWS: it neither exchanges a GitHub token nor deploys as a
role."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from local.rehearse import AWS_CLI, MINISTACK_PYTHON, Ministack
from testkit.aws import DUMMY_CREDENTIALS_ENV
from testkit.template import REPO_ROOT

pytestmark = [
    pytest.mark.long(15),
    pytest.mark.skipif(not MINISTACK_PYTHON.exists(), reason="the emulator's venv: make rehearse installs it"),
]
TEMPLATE = REPO_ROOT / "pipeline" / "deploy-role.yaml"
REPOSITORY = "acme/payments-consumer"
PROVIDER_URL = "https://token.actions.githubusercontent.com"


class Emulator:
    def __init__(self, endpoint_url: str) -> None:
        self.env = {**os.environ, **DUMMY_CREDENTIALS_ENV, "AWS_CONFIG_FILE": os.devnull}
        self.env["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
        self.endpoint_url = endpoint_url

    def aws(self, *arguments: str) -> subprocess.CompletedProcess[str]:
        command = [AWS_CLI, "--endpoint-url", self.endpoint_url, "--region", "us-east-1", "--output", "json"]
        return subprocess.run([*command, *arguments], env=self.env, capture_output=True, text=True, check=False)

    def deploy(self, stack: str, *parameters: str) -> subprocess.CompletedProcess[str]:
        """docs/deploying.md's command for the role, as written."""
        return self.aws(
            "cloudformation", "deploy", "--stack-name", stack, "--template-file", str(TEMPLATE),
            "--capabilities", "CAPABILITY_IAM", "--parameter-overrides", *parameters,
        )  # fmt: skip

    def outputs(self, stack: str) -> dict[str, str]:
        described = json.loads(self.aws("cloudformation", "describe-stacks", "--stack-name", stack).stdout)
        [found] = described["Stacks"]
        assert found["StackStatus"] in {"CREATE_COMPLETE", "UPDATE_COMPLETE"}, found["StackStatus"]
        return {output["OutputKey"]: output["OutputValue"] for output in found["Outputs"]}

    def role(self, arn: str) -> dict[str, Any]:
        name = arn.rsplit("/", 1)[-1]
        role: dict[str, Any] = json.loads(self.aws("iam", "get-role", "--role-name", name).stdout)["Role"]
        policies = json.loads(self.aws("iam", "list-role-policies", "--role-name", name).stdout)["PolicyNames"]
        role["Policies"] = {
            policy: json.loads(self.aws("iam", "get-role-policy", "--role-name", name, "--policy-name", policy).stdout)[
                "PolicyDocument"
            ]
            for policy in policies
        }
        return role


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    with tempfile.TemporaryDirectory(prefix="deploy-role-") as scratch, Ministack(scratch) as server:
        yield Emulator(server.endpoint_url)


@pytest.fixture(scope="module")
def provider(emulator: Emulator) -> str:
    created = emulator.aws(
        "iam", "create-open-id-connect-provider", "--url", PROVIDER_URL, "--client-id-list", "sts.amazonaws.com"
    )
    assert created.returncode == 0, created.stderr
    arn: str = json.loads(created.stdout)["OpenIDConnectProviderArn"]
    return arn


@pytest.fixture(scope="module")
def stages(emulator: Emulator, provider: str) -> dict[str, dict[str, str]]:
    deployed = {}
    for stage in ("dev", "prod"):
        stack = f"idempotent-sqs-consumer-pipeline-{stage}"
        result = emulator.deploy(stack, f"Repository={REPOSITORY}", f"Stage={stage}", f"OidcProviderArn={provider}")
        assert result.returncode == 0, result.stdout + result.stderr
        deployed[stage] = emulator.outputs(stack)
    return deployed


def test_each_stage_gets_its_roles_and_the_one_provider(stages: dict[str, dict[str, str]], provider: str) -> None:
    for outputs in stages.values():
        assert outputs.keys() == {"DeployRoleArn", "CloudFormationRoleArn", "OidcProviderArn"}
        assert outputs["OidcProviderArn"] == provider
    arns = [arn for outputs in stages.values() for key, arn in outputs.items() if key != "OidcProviderArn"]
    assert len(set(arns)) == 4


@pytest.mark.parametrize("stage", ["dev", "prod"])
def test_a_stages_deploy_role_trusts_that_environment_and_reaches_that_stack(
    emulator: Emulator, stages: dict[str, dict[str, str]], provider: str, stage: str
) -> None:
    role = emulator.role(stages[stage]["DeployRoleArn"])
    [trust] = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Federated": provider}
    assert trust["Condition"]["StringEquals"]["token.actions.githubusercontent.com:sub"] == (
        f"repo:{REPOSITORY}:environment:{stage}"
    )
    grants = json.dumps(role["Policies"])
    assert f"stack/idempotent-sqs-consumer-{stage}/*" in grants
    other = "prod" if stage == "dev" else "dev"
    assert f"idempotent-sqs-consumer-{other}" not in grants
    [pass_role] = [s for s in role["Policies"]["deploy"]["Statement"] if s["Action"] == "iam:PassRole"]
    assert pass_role["Resource"] == stages[stage]["CloudFormationRoleArn"]


def test_cloudformations_role_is_for_cloudformation_alone(
    emulator: Emulator, stages: dict[str, dict[str, str]]
) -> None:
    role = emulator.role(stages["dev"]["CloudFormationRoleArn"])
    [trust] = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "cloudformation.amazonaws.com"}


def test_a_stage_outside_the_two_is_refused(emulator: Emulator, provider: str) -> None:
    # AllowedValues: a stage no samconfig environment and no GitHub environment of the pipeline names.
    result = emulator.deploy(
        "pipeline-staging", f"Repository={REPOSITORY}", "Stage=staging", f"OidcProviderArn={provider}"
    )
    assert result.returncode != 0
    assert "Stage" in result.stderr + result.stdout
