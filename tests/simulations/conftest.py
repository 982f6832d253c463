"""The long simulation sweep runs only when asked for (``-m slow``; ``make sim-long``)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="a long sweep: run with -m slow")
    for item in items:
        if "slow" in item.keywords and "tests/simulations/test_regression.py" in item.nodeid:
            item.add_marker(skip)
