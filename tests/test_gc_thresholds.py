"""A running node raises the collector's young-generation threshold and puts back what was
there when the last node in the process stops."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from engine.gc_thresholds import GC_THRESHOLDS, raised_gc_thresholds


@pytest.fixture
def custom_thresholds() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    custom = (1_234, 5, 6)
    gc.set_threshold(*custom)
    yield custom
    gc.set_threshold(*before)


def test_the_thresholds_are_raised_inside_and_restored_after(
    custom_thresholds: tuple[int, int, int],
) -> None:
    with raised_gc_thresholds():
        assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_threshold() == custom_thresholds


def test_overlapping_nodes_restore_only_when_the_last_one_leaves(
    custom_thresholds: tuple[int, int, int],
) -> None:
    first, second = raised_gc_thresholds(), raised_gc_thresholds()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first node stops while the second runs on
    assert gc.get_threshold() == GC_THRESHOLDS
    second.__exit__(None, None, None)
    assert gc.get_threshold() == custom_thresholds


def test_an_error_inside_still_restores_them(custom_thresholds: tuple[int, int, int]) -> None:
    with pytest.raises(RuntimeError), raised_gc_thresholds():
        raise RuntimeError("the node failed")
    assert gc.get_threshold() == custom_thresholds
