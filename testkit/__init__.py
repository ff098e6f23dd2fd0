"""What tests/, local/, chaos/ and bench/ are built on, written once: AWS on loopback (DynamoDB Local behind the
conflict emulation, moto's SQS, Lambda's runtime under the memory setting's CPU share) and the fakes. Not deployed."""
