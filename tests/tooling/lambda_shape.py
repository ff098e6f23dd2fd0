"""The shape of the events Lambda's SQS event source sends, as the tests expect it."""

RECORD_KEYS = frozenset(
    {
        "messageId",
        "receiptHandle",
        "body",
        "attributes",
        "messageAttributes",
        "md5OfBody",
        "eventSource",
        "eventSourceARN",
        "awsRegion",
    }
)
