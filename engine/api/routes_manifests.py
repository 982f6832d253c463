"""``POST /v1/apply``: a manifest set of schedules, task types and tenants, all or nothing.

The body lists the objects as their single-object routes take them, each with an optional
``if_version`` (the write is conditional on it: 409 and nothing applied on a mismatch) and
``source`` (``file:line``, which every error about the item names). The route hands the
ledger a *planner* (:func:`planner`) that the ledger runs under the set's lock, inside the
apply's transaction (:meth:`~engine.ledger.base.Ledger.manifests_apply`): it checks every
item with the validators of the single-object routes -- schedule input, handler settings,
write-only secrets, the tenancy rules of task types -- and either refuses the whole set,
naming every bad item, or returns the changes. ``?dry_run=true`` answers the same plan and
writes nothing: what ``carillon diff`` prints. Each task type created or updated carries the
warnings a ``PUT`` of it would answer (a ``nats`` stream's duplicate window, looked up once
the plan is made, outside the transaction). ``docs/manifests.md`` is the user's guide.

An admin token applies all three kinds. A tenant token applies only schedules of its own
tenant: task types or tenants in its body are refused (403), an item naming another tenant
is a bad item, and ``prune`` deletes only its own tenant's schedules among the set's.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec
from msgspec import Meta

from engine.api import problems
from engine.api.endpoint import BATCH_BODY_BYTES_MAX, Call, Endpoint, QueryParam, Reply
from engine.api.schedule_input import replace_with_spec, schedule_from_spec
from engine.api.schemas import ScheduleSpec, TaskTypeSpec, TenantSpec
from engine.core import redaction
from engine.errors import CarillonError, InvalidField
from engine.handlers.base import SettingsWarning
from engine.handlers.registry import check_settings, retry_horizon_of, settings_warnings
from engine.ledger.manifests import (
    ManifestAction,
    ManifestChange,
    ManifestDone,
    ManifestKind,
    ManifestPlanner,
    ManifestsApply,
    ManifestState,
)
from engine.ledger.params import BATCH_ROWS_MAX
from engine.model import (
    DEFAULT_TENANT,
    IDENTIFIER_PATTERN,
    Schedule,
    TaskType,
    Tenant,
    validate_identifier,
    validate_task_type,
    validate_tenant,
)

ERRORS_SHOWN_MAX: Final = 10_000
"""Most bad items one answer lists (a set with more is refused all the same, and the
detail counts them all)."""
_LEDGER_FIELDS: Final = frozenset({"version", "updated_at", "partition_id", "next_run_at"})
"""Fields the ledger sets: never a difference between a manifest and what is stored."""
_SOURCE_LENGTH_MAX: Final = 1000

Items = Annotated[list[dict[str, Any]], Meta(max_length=BATCH_ROWS_MAX)]


class ApplyIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A manifest set as ``carillon apply`` sends it (every file merged)."""

    manifest_set: Annotated[str, Meta(min_length=1, max_length=128, pattern=IDENTIFIER_PATTERN)]
    prune: bool = False
    """Delete the objects labelled with this set that the body no longer lists."""
    schedules: Items = msgspec.field(default_factory=list)
    """Schedules as ``PUT /v1/schedules/{id}`` takes them, with ``schedule_id``."""
    task_types: Items = msgspec.field(default_factory=list)
    """Task types as ``PUT /v1/task-types/{name}`` takes them, with ``name``."""
    tenants: Items = msgspec.field(default_factory=list)
    """Tenants as ``PUT /v1/tenants/{id}`` takes them, with ``tenant_id``."""


class AppliedChange(msgspec.Struct, frozen=True):
    kind: str
    """``schedule``, ``task_type`` or ``tenant``."""
    name: str
    action: str
    """``create``, ``update``, ``adopt`` (label only), ``delete`` or ``release``."""
    fields: list[str]
    """What an update changes."""
    version: int | None
    """The version after the change (``None`` in a dry run, or when deleted)."""
    source: str | None = None
    warnings: Annotated[
        list[SettingsWarning],
        Meta(description="a task type's, as PUT /v1/task-types/{name} answers them"),
    ] = msgspec.field(default_factory=list)
    """What the writer of a task type created or updated should know, as the answer to
    ``PUT /v1/task-types/{name}`` says it (a ``nats`` stream's duplicate window); empty for
    every other change."""


class ApplyResult(msgspec.Struct, frozen=True):
    manifest_set: str
    dry_run: bool
    changes: list[AppliedChange]
    unchanged: int
    """Listed objects already as the manifests say."""


class _Item(msgspec.Struct, frozen=True):
    """A decoded manifest item with where it came from."""

    name: str
    where: str
    if_version: int | None
    spec: Any


def _where(kind: str, index: int, source: str | None) -> str:
    label = f"{kind}[{index}]"
    return label if source is None else f"{source} ({label})"


def _decode(
    raw: list[dict[str, Any]], kind: str, key: str, spec_type: type, errors: list[str]
) -> list[_Item]:
    """The items of one kind, as their specs; each bad one is added to ``errors``."""
    items: list[_Item] = []
    for index, original in enumerate(raw):
        fields = dict(original)
        source = fields.pop("source", None)
        if not isinstance(source, str) or len(source) > _SOURCE_LENGTH_MAX:
            source = None
        where = _where(kind, index, source)
        if_version = fields.pop("if_version", None)
        name = fields.pop(key, None) if kind != "schedules" else fields.get(key)
        try:
            if name is None:
                raise InvalidField(f"{key!r} is required: a manifest names its objects")
            if not isinstance(name, str):
                raise InvalidField(f"{key!r} must be a string, got {name!r}")
            validate_identifier(name, kind=key.replace("_", " "))
            if if_version is not None and (
                isinstance(if_version, bool) or not isinstance(if_version, int) or if_version < 0
            ):
                raise InvalidField("if_version must be a whole number >= 0 (0: must not exist)")
            spec: Any = msgspec.convert(fields, spec_type)
        except (msgspec.ValidationError, InvalidField, ValueError) as exc:
            errors.append(f"{where}: {exc}")
            continue
        items.append(_Item(name, where, if_version, spec))
    return items


def _differs(current: msgspec.Struct, wanted: msgspec.Struct) -> tuple[str, ...]:
    return tuple(
        name
        for name in current.__struct_fields__
        if name not in _LEDGER_FIELDS and getattr(current, name) != getattr(wanted, name)
    )


class _Planner:
    """The plan of one body for one caller: :meth:`__call__` is the ledger's planner."""

    def __init__(self, body: ApplyIn, own_tenant: str | None) -> None:
        self.body = body
        self.own_tenant = own_tenant
        self.errors: list[str] = []
        self.unchanged = 0
        """How many listed objects the last plan found as the manifests say."""
        self.wanted_task_types: dict[str, TaskType] = {}
        """The task types of the last plan, as they are written (by name)."""
        self.tenants = _decode(body.tenants, "tenants", "tenant_id", TenantSpec, self.errors)
        self.task_types = _decode(body.task_types, "task_types", "name", TaskTypeSpec, self.errors)
        self.schedules = _decode(
            body.schedules, "schedules", "schedule_id", ScheduleSpec, self.errors
        )
        for kind, items in (
            ("schedule", self.schedules),
            ("task type", self.task_types),
            ("tenant", self.tenants),
        ):
            seen: dict[str, str] = {}
            for item in items:
                if item.name in seen:
                    self.errors.append(
                        f"{item.where}: {kind} {item.name!r} is listed twice (also at "
                        f"{seen[item.name]})"
                    )
                seen.setdefault(item.name, item.where)

    def labels(self) -> list[tuple[ManifestKind, str]]:
        return [
            *((ManifestKind.SCHEDULE, item.name) for item in self.schedules),
            *((ManifestKind.TASK_TYPE, item.name) for item in self.task_types),
            *((ManifestKind.TENANT, item.name) for item in self.tenants),
        ]

    def __call__(self, state: ManifestState) -> list[ManifestChange]:
        errors = list(self.errors)
        conflicts: list[str] = []
        changes: list[ManifestChange] = []
        unchanged = 0

        def owned_elsewhere(kind: ManifestKind, item: _Item) -> bool:
            owner = state.labels.get((kind, item.name))
            if owner is not None and owner != state.manifest_set:
                errors.append(
                    f"{item.where}: {kind} {item.name!r} belongs to manifest set {owner!r}; "
                    "remove it there first"
                )
                return True
            return False

        def settle(
            kind: ManifestKind,
            item: _Item,
            current: Schedule | TaskType | Tenant | None,
            wanted: Schedule | TaskType | Tenant,
        ) -> None:
            nonlocal unchanged
            version = 0 if current is None else current.version
            if item.if_version is not None and item.if_version != version:
                state_text = "does not exist" if current is None else f"is at version {version}"
                conflicts.append(
                    f"{item.where}: {kind} {item.name!r} {state_text}, not {item.if_version}"
                )
                return
            source = item.where
            if current is None:
                changes.append(
                    ManifestChange(kind, item.name, ManifestAction.CREATE, wanted, 0, (), source)
                )
                return
            fields = _differs(current, wanted)
            labelled = state.labels.get((kind, item.name)) == state.manifest_set
            if fields:
                changes.append(
                    ManifestChange(
                        kind, item.name, ManifestAction.UPDATE, wanted, version, fields, source
                    )
                )
            elif not labelled:
                changes.append(
                    ManifestChange(kind, item.name, ManifestAction.ADOPT, None, version, (), source)
                )
            else:
                unchanged += 1

        for item in self.tenants:
            if owned_elsewhere(ManifestKind.TENANT, item):
                continue
            try:
                tenant = validate_tenant(
                    Tenant(tenant_id=item.name, **msgspec.structs.asdict(item.spec))
                )
            except CarillonError as exc:
                errors.append(f"{item.where}: {exc}")
                continue
            settle(ManifestKind.TENANT, item, state.tenants.get(item.name), tenant)

        task_types = dict(state.task_types)
        wanted_task_types: dict[str, TaskType] = {}
        for item in self.task_types:
            if owned_elsewhere(ManifestKind.TASK_TYPE, item):
                continue
            current_type = state.task_types.get(item.name)
            try:
                task_type = validate_task_type(
                    TaskType(name=item.name, **msgspec.structs.asdict(item.spec))
                )
                settings = redaction.restore(
                    task_type.kind,
                    task_type.settings,
                    None if current_type is None else current_type.settings,
                )
                check_settings(
                    task_type.kind, settings, retry_horizon_s=retry_horizon_of(task_type)
                )
                task_type = msgspec.structs.replace(task_type, settings=settings)
            except (CarillonError, ValueError) as exc:
                errors.append(f"{item.where}: {exc}")
                continue
            task_types[item.name] = wanted_task_types[item.name] = task_type
            settle(ManifestKind.TASK_TYPE, item, current_type, task_type)

        listed = {item.name for item in self.schedules}
        for item in self.schedules:
            spec: ScheduleSpec = item.spec
            current = state.schedules.get(item.name)
            if current is not None and not self._visible(current):
                # As a create of a taken id answers (docs/api.md, "One namespace of ids"):
                # taken, and nothing else -- not whose, not its set.
                errors.append(f"{item.where}: schedule id {item.name!r} is taken")
                continue
            if owned_elsewhere(ManifestKind.SCHEDULE, item):
                continue
            try:
                tenant_id = self._tenant_of(spec)
                if current is None:
                    wanted = schedule_from_spec(
                        spec, schedule_id=item.name, tenant_id=tenant_id, now=state.now
                    )
                else:
                    wanted = replace_with_spec(current, spec, now=state.now)
                used = task_types.get(wanted.task_type)
                if used is None:
                    raise InvalidField(f"task type {wanted.task_type!r} does not exist")
                if not used.usable_by(wanted.tenant_id):
                    raise InvalidField(
                        f"task type {wanted.task_type!r} is not granted to tenant "
                        f'{wanted.tenant_id!r} (docs/api.md, "Task types belong to tenants")'
                    )
            except (CarillonError, ValueError) as exc:
                errors.append(f"{item.where}: {exc}")
                continue
            except problems.Problem as problem:
                errors.append(f"{item.where}: {problem.detail}")
                continue
            settle(ManifestKind.SCHEDULE, item, current, wanted)

        if errors:
            raise problems.invalid(
                f"{len(errors)} manifest item(s) are invalid; nothing was applied",
                errors=errors[:ERRORS_SHOWN_MAX],
            )
        if conflicts:
            raise problems.Problem(
                409,
                "version-conflict",
                "The version does not match",
                f"{len(conflicts)} item(s) are not at their if_version; nothing was applied",
                errors=conflicts[:ERRORS_SHOWN_MAX],
            )
        changes.extend(self._pruned(state, listed))
        self.unchanged = unchanged
        self.wanted_task_types = wanted_task_types
        return changes

    def _tenant_of(self, spec: ScheduleSpec) -> str:
        own = self.own_tenant
        requested = spec.tenant_id
        if own is None:
            return DEFAULT_TENANT if requested is None else requested
        if requested is not None and requested != own:
            raise InvalidField(f"tenant {requested!r} not found")
        return own

    def _pruned(self, state: ManifestState, listed: set[str]) -> list[ManifestChange]:
        """Deletes (with ``prune``) and releases, after every create and update: schedules
        first, so that a task type they named can go next."""
        kept = {
            ManifestKind.SCHEDULE: listed,
            ManifestKind.TASK_TYPE: {item.name for item in self.task_types},
            ManifestKind.TENANT: {item.name for item in self.tenants},
        }
        deletes: list[ManifestChange] = []
        releases: list[ManifestChange] = []
        for kind, name in state.owned():
            if name in kept[kind]:
                continue
            current: Schedule | TaskType | Tenant | None
            if kind is ManifestKind.SCHEDULE:
                current = state.schedules.get(name)
            elif kind is ManifestKind.TASK_TYPE:
                current = state.task_types.get(name)
            else:
                current = state.tenants.get(name)
            if self.own_tenant is not None and (
                kind is not ManifestKind.SCHEDULE
                or current is None  # whose it was is unknown: an admin's apply drops it
                or (isinstance(current, Schedule) and not self._visible(current))
            ):
                continue  # a tenant token touches only its own tenant's schedules
            if current is None:  # gone meanwhile (deleted through the API): drop the label
                releases.append(ManifestChange(kind, name, ManifestAction.RELEASE))
            elif not self.body.prune:
                continue
            elif kind is ManifestKind.TENANT:  # a tenant's settings cannot be deleted
                releases.append(
                    ManifestChange(kind, name, ManifestAction.RELEASE, None, current.version)
                )
            else:
                deletes.append(
                    ManifestChange(kind, name, ManifestAction.DELETE, None, current.version)
                )
        deletes.sort(key=lambda change: change.kind is not ManifestKind.SCHEDULE)
        return deletes + releases

    def _visible(self, schedule: Schedule) -> bool:
        return self.own_tenant is None or schedule.tenant_id == self.own_tenant


def planner(body: ApplyIn, own_tenant: str | None) -> ManifestPlanner:
    """The planner of ``body`` for a caller confined to ``own_tenant`` (``None``: admin)."""
    return _Planner(body, own_tenant)


async def apply(call: Call) -> Reply:
    body: ApplyIn = call.body
    own = call.who.tenant_id
    if own is not None and (body.task_types or body.tenants):
        raise problems.forbidden(
            "a tenant token applies schedules only; task types and tenants need an admin token"
        )
    dry_run = _flag(call, "dry_run")
    plan = _Planner(body, own)
    done: list[ManifestDone] = await call.api.ledger.manifests_apply(
        ManifestsApply(
            manifest_set=body.manifest_set,
            actor=call.who.actor,
            plan=plan,
            schedule_ids=[item.name for item in plan.schedules],
            labels=plan.labels(),
            dry_run=dry_run,
        )
    )
    # Once applied (or planned), outside the ledger's transaction: the task types created
    # or updated are looked at as a PUT of each would (bounded; never failing the apply).
    written = [
        plan.wanted_task_types[item.name]
        for item in done
        if item.kind is ManifestKind.TASK_TYPE
        and item.action in (ManifestAction.CREATE, ManifestAction.UPDATE)
        and item.name in plan.wanted_task_types
    ]
    warnings = await settings_warnings(
        written,
        brokers=call.api.brokers,
        options=call.api.handler_options,
        timeout_s=call.api.broker_lookup_timeout_s,
    )
    return Reply(
        ApplyResult(
            body.manifest_set,
            dry_run,
            [
                AppliedChange(
                    str(item.kind),
                    item.name,
                    str(item.action),
                    list(item.fields),
                    item.version,
                    item.source,
                    warnings.get(item.name, []) if item.kind is ManifestKind.TASK_TYPE else [],
                )
                for item in done
            ],
            plan.unchanged,
        )
    )


def _flag(call: Call, name: str) -> bool:
    text = call.query_str(name)
    if text not in (None, "true", "false"):
        raise problems.invalid(f"query parameter {name!r} must be true or false")
    return text == "true"


ENDPOINTS: Final = (
    Endpoint(
        "POST",
        "/v1/apply",
        apply,
        "Apply a manifest set of schedules, task types and tenants, all or nothing",
        body=ApplyIn,
        response=ApplyResult,
        query=(QueryParam("dry_run", "boolean", "plan only: answer the changes, write none"),),
        body_bytes_max=BATCH_BODY_BYTES_MAX,
        too_large=f"a manifest set holds at most {BATCH_BODY_BYTES_MAX} bytes of JSON; split it "
        "into several sets",
        tag="manifests",
        errors=(403,),  # a tenant token sending task types or tenants
    ),
)
