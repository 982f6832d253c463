"""Public test toolkit for Carillon and for users testing code that embeds it.

Nothing in ``engine/`` outside this package imports it.
"""

from engine.testing.clock import ManualClock, SkewedClock

__all__ = ["ManualClock", "SkewedClock"]
