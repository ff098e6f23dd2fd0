"""What tests/, local/, chaos/ and bench/ are built on, written once. Not deployed.

AWS on loopback: DynamoDB Local behind the conflict emulation, moto's SQS, Lambda's runtime (its emulator and
awslambdaric, under the memory setting's CPU share), the resources of ``template.yaml``; and the fakes: Lambda's SQS
records, events and context, message bodies, the webhook sink, the dead letters' reader.
"""
