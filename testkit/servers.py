"""The local stack's two servers (DynamoDB Local, with its streams; moto's holds SQS, Secrets Manager, SNS and
EventBridge), and deploying the template onto them."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from testkit.aws import DUMMY_CREDENTIALS_ENV, client
from testkit.dynamodb_local import DynamoDBLocal
from testkit.moto_server import MotoServer
from testkit.processes import Lifecycle
from testkit.resources import FunctionSpec, LocalResources, create_resources
from testkit.template import TEMPLATE_PATH, Template


class LocalServers(Lifecycle):
    """DynamoDB Local and moto's SQS on loopback. Pass a running ``dynamodb`` to share it."""

    def __init__(self, dynamodb: DynamoDBLocal | None = None) -> None:
        self._owns_dynamodb = dynamodb is None
        self.dynamodb = dynamodb or DynamoDBLocal()
        self.sqs = MotoServer()

    @property
    def dynamodb_endpoint_url(self) -> str:
        return self.dynamodb.endpoint_url

    @property
    def sqs_endpoint_url(self) -> str:
        return self.sqs.endpoint_url

    def start(self) -> Self:
        with self._stopped_on_failure():
            if self._owns_dynamodb:
                self.dynamodb.start()
            self.sqs.start()
        return self

    def stop(self) -> None:
        self.sqs.stop()
        if self._owns_dynamodb:
            self.dynamodb.stop()

    def client(self, service: str, **options: Any) -> Any:
        if service in ("dynamodb", "dynamodbstreams"):
            return client(service, self.dynamodb_endpoint_url, **options)
        if service in ("sqs", "secretsmanager", "sns", "events"):
            return client(service, self.sqs_endpoint_url, **options)
        raise ValueError(f"the local stack has no {service}")

    def deploy(
        self,
        template_path: Path = TEMPLATE_PATH,
        *,
        stack_name: str | None = None,
        parameter_overrides: Mapping[str, Any] | None = None,
    ) -> LocalResources:
        """Create the template's queues and tables; a fresh stack name each call unless given."""
        template = Template.from_file(
            template_path,
            stack_name=stack_name or f"local-{uuid.uuid4().hex[:8]}",
            parameter_overrides=dict(parameter_overrides or {}),
        )
        return create_resources(template, self.client("sqs"), self.client("dynamodb"))

    def function_environment(self, function: FunctionSpec) -> dict[str, str]:
        """The function's own variables, its clients pointed at these servers (Lambda's: ``lambda_variables``) through
        boto3's own ``AWS_ENDPOINT_URL_*`` variables: the function has no local code path."""
        # Besides SQS and Secrets Manager, the relay's destinations (SNS, EventBridge): moto's server answers for all.
        moto = ("SQS", "SECRETS_MANAGER", "SNS", "EVENTBRIDGE")
        return {
            **DUMMY_CREDENTIALS_ENV,
            **function.environment,
            "AWS_ENDPOINT_URL_DYNAMODB": self.dynamodb_endpoint_url,
            **{f"AWS_ENDPOINT_URL_{service}": self.sqs_endpoint_url for service in moto},
        }
