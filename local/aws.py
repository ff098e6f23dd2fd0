"""boto3 clients for the local servers: dummy credentials, one region, no retries hiding faults."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config

REGION = "us-east-1"
# The local servers accept any credentials; fixed dummies keep real ones out of reach.
DUMMY_CREDENTIALS = {"aws_access_key_id": "local", "aws_secret_access_key": "local"}
DUMMY_CREDENTIALS_ENV = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION,
}


def client(service: str, endpoint_url: str, *, max_pool_connections: int = 10, timeout_s: float = 10.0) -> Any:
    """A client bound to ``endpoint_url`` with dummy credentials."""
    config = Config(
        max_pool_connections=max_pool_connections,
        connect_timeout=timeout_s,
        read_timeout=timeout_s,
        retries={"mode": "standard", "max_attempts": 3},
    )
    session = boto3.session.Session(region_name=REGION, **DUMMY_CREDENTIALS)
    return session.client(service, endpoint_url=endpoint_url, config=config)
