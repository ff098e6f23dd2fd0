"""boto3 clients for the local servers: dummy credentials, one region, no retries hiding faults."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config

REGION = "us-east-1"
# The local servers accept any credentials; fixed dummies keep real ones out of reach.
DUMMY_CREDENTIALS_ENV = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION,
}


def session() -> boto3.session.Session:
    """A session with dummy credentials: hooks registered on it reach every client it makes."""
    return boto3.session.Session(region_name=REGION, aws_access_key_id="local", aws_secret_access_key="local")


def client(service: str, endpoint_url: str, *, max_pool_connections: int = 10, timeout_s: float = 10.0) -> Any:
    config = Config(
        max_pool_connections=max_pool_connections,
        connect_timeout=timeout_s,
        read_timeout=timeout_s,
        retries={"mode": "standard", "max_attempts": 3},
    )
    # The stubs overload ``client`` per literal service name; this one takes the name as the caller gives it.
    return session().client(service, endpoint_url=endpoint_url, config=config)  # type: ignore[call-overload]
