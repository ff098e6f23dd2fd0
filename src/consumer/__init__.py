"""Exactly-once SQS consumer for AWS Lambda: the core, which takes an application's handlers as input.

``lambda_handler(HANDLERS)`` is the function's handler; a handler author imports from ``consumer.api``.
The core never imports the application (``src/service/``): a newer core replaces ``src/consumer/`` whole.
"""

from consumer.app import LambdaHandler, lambda_handler

__all__ = ["LambdaHandler", "__version__", "lambda_handler"]

# The core's version (CHANGELOG.md): what an application takes when it upgrades the core.
__version__ = "2.1.0"
