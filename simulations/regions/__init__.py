"""Multi-region infrastructure for game days (issue #9, ``docs/multi-region.md``).

* :mod:`~simulations.regions.replication` -- a primary and a streaming hot standby on this
  machine (:class:`~simulations.regions.replication.ReplicatedPair`), with the failover steps
  a game day needs: crash or cleanly stop the primary, promote the standby, restart the old
  primary (split brain), pause replay (a lag window) or streaming (a loss window), a planned
  switch-over.

Nothing here is imported by ``engine/``.
"""
