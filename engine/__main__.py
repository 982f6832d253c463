"""``python -m engine`` is the ``carillon`` command."""

import sys

from engine.cli import main

sys.exit(main())
