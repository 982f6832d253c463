"""The node's actors: long-running trio tasks under a supervisor.

Every actor has the same anatomy: a frozen config with named defaults, dependencies passed in
(ledger, clock, shared state), ``async def run(self, *, task_status)`` that reports readiness
once, a ``step()`` doing one iteration (tests call it directly), and ``statistics()``
returning a frozen snapshot.
"""
