"""Manifest sets: what :meth:`~engine.ledger.base.Ledger.manifests_apply` takes and returns.

A *manifest set* is a named group of schedules, task types and tenants that a team keeps as
files (``docs/manifests.md``). The ledger stores one ownership label per object --
``(kind, name) -> set name`` -- beside the object (Postgres: ``manifest_labels``, migration
0009), and applies a set in one transaction under a lock keyed by the set's name.

What changes is decided by a *planner*, a pure function the caller passes in: the ledger
reads the state under the lock (:class:`ManifestState`), calls the planner once, and writes
the changes it returns (:class:`ManifestChange`) with the ordinary write rules of each
kind, all or none. The planner lives with the API, which owns the validators (schedule
input, handler settings, secrets); keeping it a parameter keeps the ledger free of them,
and running it inside the transaction makes two applies of one set see each other's result
instead of interleaving.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from engine.errors import InvalidField
from engine.model import Schedule, TaskType, Tenant

MANIFEST_CHANGES_MAX: Final = 10_000
"""Most changes one apply may make (a batch's bound, :data:`~engine.ledger.params.
BATCH_ROWS_MAX`); a planner asking for more is refused with ``InvalidField``."""


class ManifestKind(enum.StrEnum):
    SCHEDULE = "schedule"
    TASK_TYPE = "task_type"
    TENANT = "tenant"


class ManifestAction(enum.StrEnum):
    CREATE = "create"
    """The object did not exist: created, labelled with the set."""
    UPDATE = "update"
    """It exists and differs: replaced (labelled with the set if it was not)."""
    ADOPT = "adopt"
    """It exists unlabelled and equal to the manifest: only the label is written."""
    DELETE = "delete"
    """Pruned: labelled with the set, no longer listed; deleted with its label."""
    RELEASE = "release"
    """Pruned where deleting is not possible (a tenant's settings): only the label goes."""


Label = tuple[ManifestKind, str]


@dataclass(frozen=True)
class ManifestState:
    """What the planner sees, read under the set's lock in the apply's transaction."""

    now: datetime
    """The ledger's clock."""
    manifest_set: str
    schedules: dict[str, Schedule]
    """The live schedules among those the call listed and those labelled with the set."""
    task_types: dict[str, TaskType]
    """Every task type (they are few)."""
    tenants: dict[str, Tenant]
    """Every stored tenant (they are few)."""
    labels: dict[Label, str]
    """The set name of every labelled object among those listed, and every object labelled
    with this set (whether or not it still exists)."""

    def owned(self) -> list[Label]:
        """The objects labelled with this set, sorted."""
        return sorted(key for key, name in self.labels.items() if name == self.manifest_set)


@dataclass(frozen=True)
class ManifestChange:
    """One write the planner asks for. ``record`` is the object to write (create, update)
    or ``None`` (adopt, delete, release); ``expected_version`` the version it was planned
    against (0: absent), so the write is refused if anything moved it meanwhile."""

    kind: ManifestKind
    name: str
    action: ManifestAction
    record: Schedule | TaskType | Tenant | None = None
    expected_version: int = 0
    fields: tuple[str, ...] = ()
    """The fields that differ (an update), for people reading the plan."""
    source: str | None = None
    """Where the manifest item came from (``file:line``), when the caller knows it."""


ManifestPlanner = Callable[[ManifestState], list[ManifestChange]]


@dataclass(frozen=True)
class ManifestsApply:
    manifest_set: str
    actor: str
    plan: ManifestPlanner
    schedule_ids: list[str] = field(default_factory=list)
    """The schedules the manifests list: read (and locked) with those the set owns."""
    labels: list[Label] = field(default_factory=list)
    """Every object the manifests list, so that their labels are read."""
    dry_run: bool = False


@dataclass(frozen=True)
class ManifestDone:
    """A change as made (or, in a dry run, as it would be made)."""

    kind: ManifestKind
    name: str
    action: ManifestAction
    fields: tuple[str, ...]
    version: int | None
    """The object's version after the change (``None``: deleted, released, or a dry run of
    a change whose version the ledger would assign)."""
    source: str | None = None


def audit_details(manifest_set: str, change: ManifestChange, version: int | None) -> dict[str, Any]:
    """The details of the ``manifest.apply`` event of one change (both ledgers)."""
    return {
        "manifest_set": manifest_set,
        "kind": str(change.kind),
        "change": str(change.action),
        "fields": list(change.fields),
        "version": version,
        "source": change.source,
    }


def check_changes(changes: list[ManifestChange]) -> list[ManifestChange]:
    """The planner's answer, checked for what both ledgers rely on."""
    if len(changes) > MANIFEST_CHANGES_MAX:
        raise InvalidField(
            f"the manifests would make {len(changes)} changes; at most {MANIFEST_CHANGES_MAX} "
            "are applied at once: split the set"
        )
    seen: set[Label] = set()
    for change in changes:
        key = (change.kind, change.name)
        if key in seen:
            raise InvalidField(f"{change.kind} {change.name!r} is changed twice in one apply")
        seen.add(key)
    return changes


def planned(change: ManifestChange) -> ManifestDone:
    """A change as a dry run reports it: no version yet, except an adoption's (unchanged)."""
    version = change.expected_version if change.action is ManifestAction.ADOPT else None
    return ManifestDone(
        change.kind, change.name, change.action, change.fields, version, change.source
    )
