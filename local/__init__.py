"""The developer commands of the local stack: ``make run``, ``send``, ``invoke``, ``dlq``,
``redrive``, ``demo``, ``smoke`` and ``rehearse``, with no AWS account and no Docker.

The pollers here behave as Lambda's SQS event source mapping; the services they drive
(DynamoDB Local, moto's SQS, Lambda's runtime) come from ``testkit``. Not deployed.
"""
