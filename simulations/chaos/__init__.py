"""Real-process chaos: ``carillon run`` processes, a private PostgreSQL and a webhook sink,
through SIGKILL, SIGSTOP/SIGCONT past the lease and a database restart (``docs/chaos.md``).

``python -m simulations.chaos [--quick]`` runs it. The modules, in the order a run uses them:

* :mod:`~simulations.chaos.config` -- the run's parameters and the start-delay bound;
* :mod:`~simulations.chaos.postgres` -- the private server (initdb, pg_ctl, cleanup);
* :mod:`~simulations.chaos.audit` -- triggers recording every lease change and execution write;
* :mod:`~simulations.chaos.sink` -- the webhook sink process;
* :mod:`~simulations.chaos.nodes` -- the node processes, their logs and metrics;
* :mod:`~simulations.chaos.workload` -- schedules, the independent expectation, the API calls;
* :mod:`~simulations.chaos.faults` -- the faults and the timeline;
* :mod:`~simulations.chaos.runner` -- one run from set-up to checks;
* :mod:`~simulations.chaos.checks`, :mod:`~simulations.chaos.zombie` -- the checkers;
* :mod:`~simulations.chaos.report` -- the printed table and the JSON summary.

Nothing here is imported by ``engine/``.
"""
