"""Each example's own tests, one file per example: removing an example removes its file here.

The unit fixtures (moto in process, the clock, the dead-letter queue) serve these tests too.
"""

from tests.unit.conftest import aws, clock, dynamodb, sqs

__all__ = ["aws", "clock", "dynamodb", "sqs"]
