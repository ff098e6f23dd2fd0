"""What tests/, local/, chaos/ and bench/ share, written once: Lambda's SQS records, events and context,
message bodies, the webhook sink, the template reader and the tables made from the template. Not deployed."""
