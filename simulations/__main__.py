"""``python -m simulations``: see :mod:`simulations.cli`."""

from simulations.cli import main

raise SystemExit(main())
