"""Deterministic simulation of whole Carillon clusters (see ``docs/simulation.md``).

Several real :class:`engine.node.Node` processes run in one ``trio.run`` on a mock clock,
sharing one in-memory ledger through fault-injecting proxies; every parameter, fault and
scheduling decision derives from one seed. Checkers compare what ran with an independent
expectation of what should have. Nothing in ``engine/`` imports this package.
"""
