"""Extra webhook headers from the task type's settings."""

from __future__ import annotations

import pytest

from engine.errors import InvalidField
from engine.handlers import HandlerOptions, build_handler


def test_extra_headers_are_accepted_and_checked() -> None:
    options = HandlerOptions()
    build_handler(
        "webhook",
        {"url": "https://example.com/hook", "headers": {"X-Api-Key": "k"}},
        options=options,
    )
    with pytest.raises(InvalidField, match="not a valid header name"):
        build_handler(
            "webhook",
            {"url": "https://example.com/hook", "headers": {"bad name": "v"}},
            options=options,
        )
    with pytest.raises(InvalidField, match="not allowed"):
        build_handler(
            "webhook",
            {"url": "https://example.com/hook", "headers": {"X-A": "line\r\nInjected: 1"}},
            options=options,
        )
