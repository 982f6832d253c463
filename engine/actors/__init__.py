"""The node's actors: long-running trio tasks under a supervisor.

Every actor has the same anatomy: a frozen config with named defaults (derived from the
node's settings in ``configs.py``), then by keyword ``ctx`` -- the node's shared dependencies
(``context.py``) -- and any collaborator of its own; ``async def run(self, *, task_status)``
that reports readiness once, a ``step()`` doing one iteration (tests call it directly), and
``statistics()`` returning a frozen snapshot.
"""
