"""Your application: its handlers (``handlers/``, one file each), their registry and the Lambda entry point.

Everything here is yours: an upgrade of the core (``src/consumer/``) never touches this package.
The shipped handlers are examples: replace them with your own (docs/replacing-the-examples.md).
"""
