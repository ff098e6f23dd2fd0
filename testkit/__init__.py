"""What tests/, local/, chaos/ and bench/ share to drive the consumer: Lambda's SQS shapes, message bodies,
a webhook sink and the template's tables. Not deployed."""
