"""Each example's own tests, one file per example: removing an example removes its file here.

They use the test kit (tests/kit.py: moto in process, the clock, the consumer of given handlers).
"""
