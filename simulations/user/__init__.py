"""``carillon simulate``: the simulator over a user's own schedule set (``docs/simulation.md``).

* :mod:`~simulations.user.schedule_set` reads and validates the set (JSON or a crontab);
* :mod:`~simulations.user.params` makes the run's parameters from it, the seed and the named
  fault scenarios, estimates the run's cost and refuses one over the caps;
* :mod:`~simulations.user.report` sets what ran beside the oracle's expectation, and
  :mod:`~simulations.user.render` prints it;
* :mod:`~simulations.user.command` is the command's body.
"""
