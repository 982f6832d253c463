"""The ledger contract on every backend (memory and real Postgres): the suite itself is
engine/testing/ledger_contract/, one module per area of the protocol, importable by anyone
who writes a ledger; this module runs each area against the ``backend`` fixture of
``conftest.py``.

A semantic change to the ledger lands there first. Times are taken from the ledger's own
clock (``database_now``), and moved by ``backend.advance`` -- on Postgres, an injected
``now()`` (tests/ledger/backends.py) -- never by waiting.
"""

from engine.testing.ledger_contract.api import *  # noqa: F403
from engine.testing.ledger_contract.executions import *  # noqa: F403
from engine.testing.ledger_contract.leases import *  # noqa: F403
from engine.testing.ledger_contract.lifecycle import *  # noqa: F403
from engine.testing.ledger_contract.regions import *  # noqa: F403
from engine.testing.ledger_contract.schedules import *  # noqa: F403
from engine.testing.ledger_contract.task_types import *  # noqa: F403
