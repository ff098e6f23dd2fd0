"""The local stack's developer commands (``python -m local``), with no AWS account and no Docker. The pollers here
behave as Lambda's SQS event source mapping; the services they drive come from ``testkit``. Not deployed."""
