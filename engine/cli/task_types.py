"""``carillon task-type``: define, list, show and delete task types (through the API).

A task type says what running a schedule's executions means -- a webhook, a Python function,
a command, or nothing -- and within which limits (timeout, concurrency caps, retries,
overlap). Schedules may only name task types that exist, so create them first. Task types
are admin-only in the API: these commands need an admin token.

``set`` is declarative: its command line is the task type's whole definition, and options
it leaves out take their defaults (running the same ``set`` twice changes nothing but the
version). Handler settings are checked here by building the handler once
(:func:`engine.handlers.registry.check_settings`, the check the API makes too) before
anything is sent. In ``set``, ``--url`` is the
webhook's URL; the API's address is ``--api-url`` (or ``$CARILLON_URL``).

Secrets are never printed: the API returns each one (a webhook's ``secret``, credential-like
header values, every shell ``env`` value) only as its fingerprint, ``***sha256:`` and 8 hex
digits, and any other value that looks like a credential is printed as ``***`` -- in
``--output json`` too, which is otherwise the API's JSON as received. ``rotate-secret`` gives
a webhook a new secret and keeps the old one signing for an overlap.

The API's answer to ``set`` may carry warnings (a ``nats`` stream whose duplicate window is
shorter than the task type's retry horizon, or could not be read): each is printed to stderr
as ``warning: …``; the task type was stored, and the exit code stays 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Final

from engine.cli.client import (
    Answer,
    add_client_arguments,
    add_output_argument,
    open_client,
    segment,
)
from engine.cli.flags import usage
from engine.cli.output import NONE, cell, print_table
from engine.core.redaction import FINGERPRINT_PREFIX, sensitive_name
from engine.errors import InvalidField
from engine.model import (
    ALL_TENANTS,
    BACKOFF_BASE_S_DEFAULT,
    BACKOFF_MAX_S_DEFAULT,
    MAX_ATTEMPTS_DEFAULT,
    TASK_TIMEOUT_S_DEFAULT,
    HandlerKind,
    OverlapPolicy,
    TaskType,
)

REDACTED: Final = "***"
_KIND_OPTIONS: Final = {
    HandlerKind.WEBHOOK: ("url", "secret", "header"),
    HandlerKind.PYTHON: ("callable",),
    HandlerKind.SHELL: ("argv", "env"),
    HandlerKind.NOOP: ("delay",),
    HandlerKind.REDIS: ("url", "stream", "maxlen", "dedup_ttl"),
    HandlerKind.NATS: ("url", "subject", "stream"),
    HandlerKind.RABBITMQ: ("url", "exchange", "routing_key", "mandatory", "header"),
}
_REQUIRED: Final = {
    HandlerKind.WEBHOOK: "url",
    HandlerKind.PYTHON: "callable",
    HandlerKind.SHELL: "argv",
    HandlerKind.REDIS: "url",
    HandlerKind.NATS: "url",
    HandlerKind.RABBITMQ: "url",
}
_LIMITS: Final = {
    "timeout": "timeout_s",
    "max_concurrency": "max_concurrency",
    "max_concurrency_cluster": "max_concurrency_cluster",
    "max_attempts": "max_attempts",
    "backoff_base": "backoff_base_s",
    "backoff_max": "backoff_max_s",
}
"""``set`` options -> API fields; an option left out leaves the field's default."""
_JSON_IS: Final = "the API's JSON, secrets redacted"


def _key_value(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


# --- the command ---------------------------------------------------------------------------


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "task-type",
        help="define, list, show and delete task types (through the API; admin)",
        description="Task types: what running a schedule's executions means, and its limits.",
    )
    parser.set_defaults(handler=lambda _: usage(parser))
    actions = parser.add_subparsers(metavar="ACTION", parser_class=type(parser))
    _add_set(actions)
    listing = actions.add_parser("list", help="list the task types (secrets redacted)")
    add_client_arguments(listing, output=False)
    add_output_argument(listing, _JSON_IS)
    listing.set_defaults(handler=run_list)
    show = actions.add_parser("show", help="show one task type (secrets redacted)")
    show.add_argument("name", metavar="NAME")
    add_client_arguments(show, output=False)
    add_output_argument(show, _JSON_IS)
    show.set_defaults(handler=run_show)
    rotate = actions.add_parser(
        "rotate-secret",
        help="give a webhook a new signing secret, signing with the old one too for a while",
        description="Rotate a webhook task type's signing secret. Until the overlap ends, "
        "every request carries two signatures (Standard Webhooks allows several), so each "
        "receiver can switch to the new secret at its own pace.",
    )
    rotate.add_argument("name", metavar="NAME")
    rotate.add_argument("--secret", required=True, help="the new secret (whsec_ + base64)")
    rotate.add_argument(
        "--overlap",
        type=float,
        default=86400.0,
        metavar="S",
        help="seconds during which the old secret signs too (0: at once) [86400]",
    )
    add_client_arguments(rotate, output=False)
    add_output_argument(rotate, _JSON_IS)
    rotate.set_defaults(handler=run_rotate)
    delete = actions.add_parser("delete", help="delete a task type that no schedule uses any more")
    delete.add_argument("name", metavar="NAME")
    add_client_arguments(delete)
    delete.set_defaults(handler=run_delete)


def _add_set(actions: Any) -> None:
    parser = actions.add_parser(
        "set",
        help="create or replace a task type",
        description="Create or replace a task type. The command line is its whole definition: "
        "options left out take their defaults.",
    )
    parser.add_argument("name", metavar="NAME")
    parser.add_argument(
        "--kind", required=True, choices=[kind.value for kind in HandlerKind], help="handler kind"
    )
    kinds = parser.add_argument_group("handler settings (by kind)")
    kinds.add_argument(
        "--url",
        help="webhook: the http(s) URL to POST to; redis: the server, "
        "redis[s]://[user:password@]host[:port][/db]; nats: nats|tls://[credentials@]host[:port]; "
        "rabbitmq: amqp[s]://[user:password@]host[:port][/vhost] "
        "(credentials never printed back)",
    )
    kinds.add_argument("--secret", help="webhook: signing secret (never printed back)")
    kinds.add_argument(
        "--header",
        type=_key_value,
        action="append",
        metavar="NAME=VALUE",
        help="webhook: an extra request header; rabbitmq: an extra message header (repeatable)",
    )
    kinds.add_argument("--callable", help="python: the function, as package.module:function")
    kinds.add_argument("--argv", help='shell: the command as a JSON list, e.g. \'["/bin/x", "a"]\'')
    kinds.add_argument(
        "--env",
        type=_key_value,
        action="append",
        metavar="NAME=VALUE",
        help="shell: an environment variable for the command (repeatable)",
    )
    kinds.add_argument("--delay", type=float, metavar="S", help="noop: seconds to wait")
    kinds.add_argument(
        "--stream",
        help="redis: the stream's key to append to; nats: the JetStream stream the subject "
        "must land in",
    )
    kinds.add_argument("--subject", help="nats: the subject to publish to")
    kinds.add_argument(
        "--exchange", help="rabbitmq: the exchange to publish to ['': the default exchange]"
    )
    kinds.add_argument(
        "--routing-key", help="rabbitmq: the routing key (the queue, on the default exchange)"
    )
    kinds.add_argument(
        "--mandatory",
        action=argparse.BooleanOptionalAction,
        help="rabbitmq: an unroutable message fails the attempt for good (--no-mandatory: "
        "the broker drops it) [mandatory]",
    )
    kinds.add_argument(
        "--maxlen", type=int, metavar="N", help="redis: keep about N entries (MAXLEN ~)"
    )
    kinds.add_argument(
        "--dedup-ttl",
        type=int,
        metavar="S",
        help="redis: seconds an execution id is remembered [a day, or the retry horizon]",
    )
    limits = parser.add_argument_group("limits (defaults in brackets)")
    limits.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help=f"seconds per attempt [{TASK_TIMEOUT_S_DEFAULT:g}]",
    )
    limits.add_argument(
        "--max-concurrency", type=int, metavar="N", help="running at once per node [no cap]"
    )
    limits.add_argument(
        "--max-concurrency-cluster", type=int, metavar="N", help="running at once in the cluster"
    )
    limits.add_argument(
        "--max-attempts",
        type=int,
        metavar="N",
        help=f"attempts before dead-lettering [{MAX_ATTEMPTS_DEFAULT}]",
    )
    limits.add_argument(
        "--backoff-base",
        type=float,
        metavar="S",
        help=f"first retry delay [{BACKOFF_BASE_S_DEFAULT:g}]",
    )
    limits.add_argument(
        "--backoff-max",
        type=float,
        metavar="S",
        help=f"longest retry delay [{BACKOFF_MAX_S_DEFAULT:g}]",
    )
    limits.add_argument(
        "--overlap",
        choices=[policy.value for policy in OverlapPolicy],
        help="default overlap policy of this type's schedules",
    )
    users = parser.add_argument_group(
        "who may use it (default: the default tenant only)"
    ).add_mutually_exclusive_group()
    users.add_argument(
        "--tenant",
        metavar="TENANT",
        help="owned by this tenant: only its schedules may name it",
    )
    users.add_argument(
        "--allow",
        action="append",
        metavar="TENANT",
        help="shared, and granted to this tenant (repeatable); '*' grants it to every tenant "
        "(webhook and noop only)",
    )
    parser.add_argument(
        "--skip-handler-check",
        action="store_true",
        help="send the settings without checking them here first (the API makes the same "
        "check when it stores them)",
    )
    add_client_arguments(parser, output=False, url_flag=False)
    add_output_argument(parser, _JSON_IS)
    parser.set_defaults(handler=run_set)


def run_set(args: argparse.Namespace) -> int:
    body = task_type_body(args)
    if not args.skip_handler_check:
        from engine.handlers.registry import check_settings  # the handlers load only here

        check_settings(args.kind, body["settings"], retry_horizon_s=_retry_horizon(body))
    with open_client(args) as api:
        answer = api.call("PUT", f"/v1/task-types/{segment(args.name)}", body=body)
    print_warnings(answer.json().get("warnings"))
    stored = redacted(answer.json())
    if args.output == "json":
        _print_json(answer, stored)
        return 0
    verb = "created" if stored["version"] == 1 else "updated"
    print(f"{verb} task type {stored['name']!r} (version {stored['version']})")
    _print_task_type(stored)
    return 0


def run_list(args: argparse.Namespace) -> int:
    with open_client(args) as api:
        answer = api.call("GET", "/v1/task-types")
    task_types = [redacted(t) for t in answer.json()]
    if args.output == "json":
        _print_json(answer, task_types)
    elif not task_types:
        print("no task types; create one with `carillon task-type set NAME --kind ...`")
    else:
        _print_table(task_types)
    return 0


def run_show(args: argparse.Namespace) -> int:
    with open_client(args) as api:
        answer = api.call("GET", f"/v1/task-types/{segment(args.name)}")
    task_type = redacted(answer.json())
    if args.output == "json":
        _print_json(answer, task_type)
    else:
        _print_task_type(task_type)
    return 0


def run_rotate(args: argparse.Namespace) -> int:
    body = {"secret": args.secret, "overlap_s": args.overlap}
    with open_client(args) as api:
        answer = api.call("POST", f"/v1/task-types/{segment(args.name)}:rotate-secret", body=body)
    stored = redacted(answer.json())
    if args.output == "json":
        _print_json(answer, stored)
        return 0
    until = stored["settings"].get("previous_secret_until")
    overlap = "at once" if until is None else f"signing with the old one too until {until}"
    print(f"rotated the secret of task type {stored['name']!r} ({overlap})")
    _print_task_type(stored)
    return 0


def run_delete(args: argparse.Namespace) -> int:
    with open_client(args) as api:
        api.call("DELETE", f"/v1/task-types/{segment(args.name)}")
    if args.output == "table":  # the API answers 204 without a body: json prints nothing
        print(f"deleted task type {args.name!r}")
    return 0


# --- from flags to a task type -------------------------------------------------------------


def task_type_body(args: argparse.Namespace) -> dict[str, Any]:
    """The task type ``set`` describes, as the API's JSON; ``InvalidField`` for options of
    another kind or a missing required one."""
    kind = HandlerKind(args.kind)
    given = [
        option
        for options in _KIND_OPTIONS.values()
        for option in options
        if getattr(args, option) is not None
    ]
    for option in given:
        if option not in _KIND_OPTIONS[kind]:
            owners = " or ".join(k for k, options in _KIND_OPTIONS.items() if option in options)
            flag = option.replace("_", "-")
            raise InvalidField(f"--{flag} applies only to --kind {owners}, not to --kind {kind}")
    required = _REQUIRED.get(kind)
    if required is not None and getattr(args, required) is None:
        raise InvalidField(f"--kind {kind} needs --{required}")
    body: dict[str, Any] = {"kind": kind.value, "settings": _settings(kind, args)}
    for option, field in _LIMITS.items():
        if getattr(args, option) is not None:
            body[field] = getattr(args, option)
    if args.overlap is not None:
        body["overlap"] = args.overlap
    if args.tenant is not None:
        body["tenant_id"] = args.tenant
    if args.allow is not None:
        body["allowed_tenants"] = args.allow
    return body


def _settings(kind: HandlerKind, args: argparse.Namespace) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    if kind is HandlerKind.WEBHOOK:
        settings["url"] = args.url
        if args.secret is not None:
            settings["secret"] = args.secret
        if args.header:
            settings["headers"] = dict(args.header)
    elif kind is HandlerKind.PYTHON:
        settings["callable"] = args.callable
    elif kind is HandlerKind.SHELL:
        settings["argv"] = _argv(args.argv)
        if args.env:
            settings["env"] = dict(args.env)
    elif kind is HandlerKind.REDIS:
        settings["url"] = args.url
        if args.stream is not None:
            settings["stream"] = args.stream
        if args.maxlen is not None:
            settings["maxlen"] = args.maxlen
        if args.dedup_ttl is not None:
            settings["dedup_ttl_s"] = args.dedup_ttl
    elif kind is HandlerKind.NATS:
        settings["url"] = args.url
        if args.subject is not None:
            settings["subject"] = args.subject
        if args.stream is not None:
            settings["stream"] = args.stream
    elif kind is HandlerKind.RABBITMQ:
        settings["url"] = args.url
        for option in ("exchange", "routing_key", "mandatory"):
            if getattr(args, option) is not None:
                settings[option] = getattr(args, option)
        if args.header:
            settings["headers"] = dict(args.header)
    elif args.delay is not None:
        settings["delay_s"] = args.delay
    return settings


def _retry_horizon(body: dict[str, Any]) -> float:
    """The worst retry horizon of the task type ``body`` describes (the API's check)."""
    from engine.handlers.registry import retry_horizon_of  # the handlers load only here

    fields = {
        field: body[field]
        for field in ("timeout_s", "max_attempts", "backoff_base_s", "backoff_max_s")
        if field in body
    }
    return retry_horizon_of(TaskType(name="horizon", kind=HandlerKind.NOOP, **fields))


def _argv(text: str) -> list[str]:
    try:
        argv = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidField(
            f'--argv must be a JSON list of strings such as \'["/usr/bin/backup", "--full"]\' '
            f"({exc.msg})"
        ) from None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise InvalidField(
            "--argv must be a non-empty JSON list of strings such as '[\"/usr/bin/backup\"]'"
        )
    return argv


# --- output --------------------------------------------------------------------------------


def _hidden(name: str, value: Any) -> Any:
    """What to print of a setting called ``name``: the API's fingerprint of a secret as it
    came, any other value that looks like a credential as ``***``."""
    if isinstance(value, str) and value.startswith(FINGERPRINT_PREFIX):
        return value
    if name == "previous_secret_until":  # when a rotation's overlap ends: no secret
        return value
    return REDACTED if sensitive_name(name) else value


def redact_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` safe to print, keys sorted. The API shows secrets as fingerprints
    (``***sha256:…``, :mod:`engine.core.redaction`); whatever else looks like a credential
    (``Authorization``, ``API_TOKEN`` ...) is printed as ``***`` all the same."""
    shown: dict[str, Any] = {}
    for name, value in sorted(settings.items()):
        if name in ("headers", "env") and isinstance(value, dict):
            shown[name] = {k: _hidden(k, v) for k, v in sorted(value.items())}
        else:
            shown[name] = _hidden(name, value)
    return shown


def redacted(task_type: dict[str, Any]) -> dict[str, Any]:
    """A task type as the API returns it, its settings redacted (other fields in order)."""
    return {**task_type, "settings": redact_settings(task_type.get("settings") or {})}


def print_warnings(warnings: Any) -> None:
    """Each warning of a write's answer (``{code, message}``) on stderr as ``warning: …``:
    the write was made, so the exit code stays 0 and stdout keeps only the answer."""
    for warning in warnings or ():
        message = warning.get("message") if isinstance(warning, dict) else None
        print(f"warning: {message or warning}", file=sys.stderr)


def _print_json(answer: Answer, shown: Any) -> None:
    """The API's answer, its secrets redacted: unchanged when it held none."""
    if shown == answer.json():
        print(answer.text)
    else:
        print(json.dumps(shown, separators=(",", ":")))


def users(task_type: dict[str, Any]) -> str:
    """Who may use a task type, in words: its owner, or the tenants it is granted to."""
    owner = task_type.get("tenant_id")
    if owner is not None:
        return f"tenant {owner} (its owner) only"
    granted = task_type.get("allowed_tenants") or []
    if ALL_TENANTS in granted:
        return "every tenant"
    return ", ".join(granted) if granted else "no tenant"


def _print_task_type(task_type: dict[str, Any]) -> None:
    def number(name: str) -> str:
        value = task_type.get(name)
        return "none" if value is None else f"{value:g}"

    print(f"name: {task_type['name']}")
    print(f"kind: {task_type['kind']}")
    settings = task_type["settings"]
    print("settings:" if settings else "settings: none")
    for name, value in settings.items():
        text = value if isinstance(value, str) else json.dumps(value)
        print(f"  {name}: {text}")
    print(f"timeout_s: {number('timeout_s')}")
    print(f"max_concurrency: {number('max_concurrency')} (per node)")
    print(f"max_concurrency_cluster: {number('max_concurrency_cluster')}")
    print(f"max_attempts: {task_type['max_attempts']}")
    print(f"backoff_base_s: {number('backoff_base_s')}")
    print(f"backoff_max_s: {number('backoff_max_s')}")
    overlap = task_type.get("overlap") or "none (each schedule's own)"
    print(f"overlap: {overlap}")
    print(f"used by: {users(task_type)}")
    updated = task_type.get("updated_at")
    print(f"version: {task_type['version']}" + ("" if updated is None else f" (updated {updated})"))


def _print_table(task_types: list[dict[str, Any]]) -> None:
    print_table(
        (
            "NAME",
            "KIND",
            "TIMEOUT_S",
            "MAX_CONC",
            "CLUSTER_CONC",
            "ATTEMPTS",
            "OVERLAP",
            "VER",
            "TENANTS",
        ),
        [
            (
                t["name"],
                t["kind"],
                cell(float(t["timeout_s"])),
                cell(t.get("max_concurrency")),
                cell(t.get("max_concurrency_cluster")),
                str(t["max_attempts"]),
                t.get("overlap") or NONE,
                str(t["version"]),
                t["tenant_id"] + "(owner)"
                if t.get("tenant_id")
                else ",".join(t.get("allowed_tenants") or []) or NONE,
            )
            for t in task_types
        ],
    )
