"""Exactly-once SQS consumer for AWS Lambda."""
