"""The ledger: the durable store of schedules and of every execution Carillon plans and runs.

The ledger table is the dispatch queue: anything not yet terminal in it is recoverable by the
next owner of its partition. PostgreSQL is reached through one door, the uvloop thread of
:mod:`engine.ledger.bridge`, and :mod:`engine.ledger.database` decides which server that is.
Only the ``postgres`` package and ``bridge.py`` import asyncpg or uvloop
(``tests/test_layering.py`` enforces it); everything else in the engine stays on trio.
"""
