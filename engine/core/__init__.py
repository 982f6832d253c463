"""Pure, synchronous scheduling logic: no I/O, no trio, no database, no clock.

Everything here takes the current time as an argument, so it is deterministic and testable
on its own (enforced by ``tests/test_layering.py``).
"""
