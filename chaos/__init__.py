"""Fault injection for the consumer: a workload through the real consumer in Lambda's runtime on the
local stack, faults at named points of its code path, the whole history checked against invariants."""
