"""The operations kit in docs/ops/: alerting rules, Grafana dashboard and runbook stay true.

Every alert is complete and links to a runbook section that exists; every metric that a rule
or a dashboard query names is one that ``engine/metrics/`` declares; every ``carillon``
command the runbook tells an operator to type exists. ``promtool`` (when installed) checks
the rules file, the rules' unit tests and that every dashboard query parses.

PyYAML is not a dependency, so the rules file is read with :func:`load_yaml_subset`: block
mappings and sequences, ``|`` block scalars, quoted and plain scalars -- the style the rules
file keeps to. Where PyYAML happens to be installed, a test checks both readings agree.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from engine.cli import build_parser
from engine.metrics import NodeMetrics

OPS = Path(__file__).resolve().parents[1] / "docs" / "ops"
RULES = OPS / "alerts.yml"
RULE_TESTS = OPS / "alerts.test.yml"
DASHBOARD = OPS / "grafana-dashboard.json"
RUNBOOK = OPS / "runbook.md"
RUNBOOK_PREFIX = "docs/ops/runbook.md#"

PROMETHEUS_BUILTINS = {"up"}
SEVERITIES = {"critical", "warning"}
PROMQL_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "inf", "nan",
}  # fmt: skip
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gauge": ("",),
}
# Metric families an operator needs on the dashboard (issue #6; docs/ops/runbook.md).
DASHBOARD_MUST_SHOW = {
    "due_jobs_enqueued_total",
    "carillon_starts_total",
    "carillon_start_delay_seconds_bucket",
    "carillon_start_slo_ratio",
    "carillon_starts_late_total",
    "carillon_queue_depth",
    "scheduler_lag_seconds",
    "carillon_planner_lag_seconds",
    "carillon_checkpoint_age_seconds",
    "carillon_lease_acquisitions_total",
    "carillon_lease_losses_total",
    "dead_letter_total",
    "carillon_clock_offset_seconds",
    "execution_attempts_total",
    "execution_duration_ms_bucket",
    "carillon_enqueue_delay_seconds_bucket",
    "carillon_skipped_total",
    "carillon_retries_total",
}


# -- a YAML subset reader -------------------------------------------------------------------


class YamlSubsetError(ValueError):
    pass


def load_yaml_subset(text: str) -> Any:
    lines = [
        (len(raw) - len(raw.lstrip(" ")), raw.rstrip())
        for raw in text.splitlines()
        if raw.strip() and not raw.lstrip().startswith("#")
    ]
    value, end = _block(lines, 0, lines[0][0])
    if end != len(lines):
        raise YamlSubsetError(f"unexpected content: {lines[end][1]!r}")
    return value


def _block(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[Any, int]:
    if lines[i][1].lstrip().startswith("- "):
        return _sequence(lines, i, indent)
    return _mapping(lines, i, indent)


def _sequence(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[list[Any], int]:
    items: list[Any] = []
    while i < len(lines) and lines[i][0] == indent and lines[i][1].lstrip().startswith("- "):
        content = lines[i][1][indent + 2 :]
        item: Any
        if re.match(r"[A-Za-z_][\w]*:( |$)", content):
            lines[i] = (indent + 2, " " * (indent + 2) + content)  # the item is a mapping
            item, i = _mapping(lines, i, indent + 2)
        else:
            item, i = _scalar(content), i + 1
        items.append(item)
    return items, i


def _mapping(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[dict[str, Any], int]:
    result: dict[str, Any] = {}
    while i < len(lines) and lines[i][0] == indent and not lines[i][1].lstrip().startswith("- "):
        match = re.fullmatch(r"([A-Za-z_][\w]*):(?: (.*))?", lines[i][1][indent:])
        if match is None:
            raise YamlSubsetError(f"not a 'key: value' line: {lines[i][1]!r}")
        key, rest = match.group(1), (match.group(2) or "").strip()
        if key in result:
            raise YamlSubsetError(f"duplicate key {key!r}")
        if rest == "|":
            result[key], i = _literal(lines, i, indent)
        elif rest:
            result[key], i = _scalar(rest), i + 1
        else:
            i += 1
            if i == len(lines) or lines[i][0] < indent:
                raise YamlSubsetError(f"{key!r} has no value")
            nested = lines[i][0]
            if nested == indent and not lines[i][1].lstrip().startswith("- "):
                raise YamlSubsetError(f"{key!r} has no value")
            result[key], i = _block(lines, i, nested)
    return result, i


def _literal(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[str, int]:
    i += 1
    body: list[tuple[int, str]] = []
    while i < len(lines) and lines[i][0] > indent:
        body.append(lines[i])
        i += 1
    if not body:
        raise YamlSubsetError("empty block scalar")
    margin = body[0][0]
    if any(depth < margin for depth, _ in body):
        raise YamlSubsetError("block scalar less indented than its first line")
    return "".join(text[margin:] + "\n" for _, text in body), i


def _scalar(text: str) -> str:
    if text.startswith('"'):
        if not text.endswith('"') or len(text) < 2:
            raise YamlSubsetError(f"unterminated string: {text!r}")
        value: str = json.loads(text)
        return value
    if text.startswith("'"):
        if not text.endswith("'") or len(text) < 2:
            raise YamlSubsetError(f"unterminated string: {text!r}")
        return text[1:-1].replace("''", "'")
    if text[0] in "[{&*!|>%@`" or ": " in text or " #" in text:
        raise YamlSubsetError(f"quote this scalar for the subset reader: {text!r}")
    return text


def test_subset_reader_refuses_what_it_does_not_understand() -> None:
    with pytest.raises(YamlSubsetError):
        load_yaml_subset("a: b: c\n")
    with pytest.raises(YamlSubsetError):
        load_yaml_subset("a: {b: 1}\n")
    assert load_yaml_subset('a:\n  - x: "1"\n    y: |\n      z\n  - w\n') == {
        "a": [{"x": "1", "y": "z\n"}, "w"]
    }


# -- helpers --------------------------------------------------------------------------------


def rules() -> list[dict[str, Any]]:
    document = load_yaml_subset(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_panels() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for panel in dashboard()["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))  # panels of a collapsed row
    return [panel for panel in found if panel["type"] != "row"]


def dashboard_queries() -> list[str]:
    queries = [t["expr"] for p in dashboard_panels() for t in p.get("targets", [])]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            query = query["query"] if isinstance(query, dict) else query
            match = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
            queries.append(match.group(1) if match else query)
    return queries


def declared_series() -> set[str]:
    """Every series name a node exposes, from its registry: counters with ``_total``,
    histograms as ``_bucket``/``_count``/``_sum``."""
    names: set[str] = set()
    for family in NodeMetrics(tenant_labels=True).registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (label names, functions and keywords
    removed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.:$])[A-Za-z_:][\w:]*", expr):
        token = match.group()
        if expr[match.end() :].lstrip().startswith("(") or token in PROMQL_KEYWORDS:
            continue
        names.add(token)
    return names


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", heading.strip().lower()))


def runbook_anchors() -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", RUNBOOK.read_text(), re.M)}


def runbook_sections() -> dict[str, str]:
    parts = re.split(r"^## (.+)$", RUNBOOK.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_metric_names_ignore_labels_functions_and_durations() -> None:
    expr = (
        'sum by (job) (rate(a_total{job=~"$job"}[$__rate_interval])) / 1e3 > 14.4 * 0.01 '
        "and on (instance) histogram_quantile(0.5, b_bucket) unless c offset 5m"
    )
    assert metric_names(expr) == {"a_total", "b_bucket", "c"}


# -- rules ----------------------------------------------------------------------------------


def test_every_alert_has_expr_for_severity_summary_description_and_runbook() -> None:
    found = alerts()
    assert len(found) >= 7
    for alert in found:
        name = alert["alert"]
        assert re.fullmatch(r"Carillon[A-Z]\w+", name), name
        assert alert["expr"].strip(), name
        assert re.fullmatch(r"\d+[smh]", alert["for"]), name
        assert alert["labels"]["severity"] in SEVERITIES, name
        annotations = alert["annotations"]
        assert annotations["summary"].strip(), name
        assert annotations["description"].strip(), name
        assert annotations["runbook_url"].startswith(RUNBOOK_PREFIX), name


def test_alert_names_are_unique() -> None:
    names = [alert["alert"] for alert in alerts()]
    assert len(names) == len(set(names))


def test_the_alerts_cover_what_issue_6_asks_for() -> None:
    used = set().union(*(metric_names(alert["expr"]) for alert in alerts()))
    assert {
        "carillon_queue_depth",  # queue depth growing
        "scheduler_lag_seconds",  # scheduler lag
        "carillon_starts_late_total",  # SLO burn
        "dead_letter_total",  # dead letters growing
        "carillon_lease_losses_total",  # lease churn
        "carillon_clock_offset_seconds",  # clock skew
        "up",  # node down
    } <= used


def test_every_runbook_url_points_at_a_runbook_heading() -> None:
    anchors = runbook_anchors()
    for alert in alerts():
        anchor = alert["annotations"]["runbook_url"].removeprefix(RUNBOOK_PREFIX)
        assert anchor in anchors, f"{alert['alert']}: no heading for #{anchor} in runbook.md"


def test_every_alert_section_says_what_it_means_how_to_confirm_and_what_to_do() -> None:
    sections = runbook_sections()
    for alert in alerts():
        body = sections.get(alert["alert"])
        assert body is not None, alert["alert"]
        for part in ("**What it means.**", "**Confirm.**", "**What to do.**"):
            assert part in body, f"{alert['alert']}: missing {part}"


def test_rule_expressions_read_only_declared_metrics() -> None:
    declared = declared_series() | PROMETHEUS_BUILTINS
    for rule in rules():
        unknown = metric_names(rule["expr"]) - declared
        assert not unknown, f"{rule.get('alert', rule.get('record'))}: {sorted(unknown)}"


def test_subset_reader_agrees_with_pyyaml() -> None:
    yaml = pytest.importorskip("yaml")
    assert load_yaml_subset(RULES.read_text()) == yaml.safe_load(RULES.read_text())


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (it comes with Prometheus)")
    return path


def run_promtool(*args: str) -> None:
    result = subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_accepts_the_rules() -> None:
    run_promtool("check", "rules", str(RULES))


def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    run_promtool("test", "rules", str(RULE_TESTS))


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    concrete = [
        query.replace("$__rate_interval", "1m")
        .replace("$job", "carillon")
        .replace("$instance", ".*")
        for query in dashboard_queries()
    ]
    records = [
        f"      - record: dashboard:query{index}\n        expr: {json.dumps(query)}\n"
        for index, query in enumerate(concrete)
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text("groups:\n  - name: dashboard\n    rules:\n" + "".join(records))
    run_promtool("check", "rules", str(path))


# -- dashboard ------------------------------------------------------------------------------


def test_dashboard_is_json_of_a_recent_schema_with_a_datasource_variable() -> None:
    board = dashboard()
    assert board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"


def test_every_panel_and_query_uses_the_datasource_variable() -> None:
    for panel in dashboard_panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_panel_ids_are_unique() -> None:
    ids = [panel["id"] for panel in dashboard()["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_queries_read_only_declared_metrics() -> None:
    declared = declared_series() | PROMETHEUS_BUILTINS
    for query in dashboard_queries():
        unknown = metric_names(query) - declared
        assert not unknown, f"{query}: {sorted(unknown)}"


def test_dashboard_shows_every_metric_family_that_matters() -> None:
    shown = set().union(*(metric_names(query) for query in dashboard_queries()))
    assert DASHBOARD_MUST_SHOW - shown == set()


# -- runbook --------------------------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return set(parser._option_string_actions)


def test_runbook_commands_exist_in_the_cli() -> None:
    spans = re.findall(r"`([^`]+)`", RUNBOOK.read_text())
    commands = [" ".join(span.split()) for span in spans if span.startswith("carillon ")]
    assert commands
    root = build_parser()
    for command in commands:
        words = command.split()[1:]
        parser, used = root, []
        while words and words[0] in subcommands(parser):
            used.append(words[0])
            parser = subcommands(parser)[words.pop(0)]
        assert used, f"{command!r}: no such command"
        flags = {word.split("=")[0] for word in words if word.startswith("--")}
        assert flags <= options(parser), f"{command!r}: unknown {sorted(flags - options(parser))}"


def test_runbook_links_within_the_page_resolve() -> None:
    anchors = runbook_anchors()
    for anchor in re.findall(r"\]\(#([^)]+)\)", RUNBOOK.read_text()):
        assert anchor in anchors, anchor


def test_runbook_names_only_declared_metrics() -> None:
    histograms = {
        family.name for family in NodeMetrics().registry.collect() if family.type == "histogram"
    }
    declared = declared_series() | histograms | PROMETHEUS_BUILTINS
    pattern = r"`((?:carillon_|scheduler_|due_jobs_|execution_|dead_letter)\w*)"
    named = set(re.findall(pattern, RUNBOOK.read_text()))
    assert named
    assert named - declared == set()
