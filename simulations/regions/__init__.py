"""Multi-region infrastructure for game days (issue #9, ``docs/multi-region.md``).

* :mod:`~simulations.regions.replication` -- a primary and a streaming hot standby on this
  machine (:class:`~simulations.regions.replication.ReplicatedPair`), with the failover steps
  a game day needs: crash or cleanly stop the primary, promote the standby, restart the old
  primary (split brain), pause replay (a lag window) or streaming (a loss window), a planned
  switch-over.

``python -m simulations.regions gameday [--quick]`` runs the game day. Its modules, in the
order a run uses them:

* :mod:`~simulations.regions.config` -- the parameters, the recovery bound, the window in
  which duplicate deliveries are allowed;
* :mod:`~simulations.regions.stage` -- the pair, the schema, region A's and region B's
  ``carillon run`` processes, the webhook sink, the schedules;
* :mod:`~simulations.regions.gameday` -- the forced failover and the planned switch-over;
* :mod:`~simulations.regions.observe` -- what the run watches (region B's recovery, region A
  standing by) and its record of each variant;
* :mod:`~simulations.regions.verdicts` -- the checkers;
* :mod:`~simulations.regions.report` -- the printed tables and the JSON summary.

It reuses the chaos run's node processes, sink, workload, audit triggers and checkers
(:mod:`simulations.chaos`). Nothing here is imported by ``engine/``.
"""
