"""Fault injection for the consumer: a workload through the real pipeline, faults at named points, invariants.

Not deployed: it drives ``consumer.app.wire`` on the local stack (``local/``) and checks
the whole history afterwards, the way Jepsen checks queue and lock claims.
"""
