"""The Grafana dashboard and docs/metrics.md name only series that jobrun exports.

The names exported are read from a real Metrics registry after a real worker
ran jobs, with the cluster collector on, parsed as Prometheus parses them.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from jobrun.job.model import NewJob
from jobrun.observe.metrics import Metrics
from jobrun.postgres.store import Store
from jobrun.worker import Registry, Worker, WorkerConfig
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "contrib" / "grafana" / "jobrun.json"
DOCS = ROOT / "docs" / "metrics.md"

# The sample names Prometheus stores for each type of metric family.
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
}
NAME = re.compile(r"\bjobrun_[a-z0-9_]*[a-z0-9]\b")


def families(metrics: Metrics) -> dict[str, str]:
    """Family name -> type (jobrun exports no ``_created`` series to leave out)."""
    text = generate_latest(metrics.registry).decode()
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def sample_names(found: dict[str, str]) -> set[str]:
    return {name + suffix for name, kind in found.items() for suffix in SUFFIXES[kind]}


def names_in(expr: str) -> set[str]:
    return set(NAME.findall(expr))


@pytest.fixture(scope="module")
def dashboard() -> Any:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture
def exported(store: Store) -> Iterator[dict[str, str]]:
    """Metric families of a Metrics after a real worker ran jobs, cluster collector on."""
    registry = Registry()
    registry.register("ok", lambda ctx, job: None)
    for _ in range(3):
        store.enqueue(NewJob(type="ok"))
    store.enqueue(NewJob(type="stray"))
    metrics = Metrics()
    worker = Worker(
        store,
        registry,
        WorkerConfig(
            heartbeat_interval=dt.timedelta(milliseconds=200),
            poll_interval=dt.timedelta(milliseconds=200),
            lease_ttl=dt.timedelta(seconds=3),
            unknown_type_releases=0,
        ),
        hooks=[metrics],
    )
    metrics.watch_worker(worker)
    metrics.watch_cluster(store, cache_seconds=0)
    with worker:
        worker.start()

        def ran() -> bool:
            text = generate_latest(metrics.registry).decode()
            return (
                'jobrun_jobs_finished_total{outcome="succeeded",queue="default",type="ok"} 3.0'
                in text
            )

        wait_for(ran)
        yield families(metrics)


def all_panels(dashboard: Any) -> list[Any]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def targets(dashboard: Any) -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in all_panels(dashboard)
        for target in panel.get("targets", [])
    ]


def test_the_dashboard_is_a_grafana_dashboard_on_a_prometheus_datasource_variable(
    dashboard: Any,
) -> None:
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 30
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = [p for p in all_panels(dashboard) if p["type"] != "row"]
    assert len(panels) >= 15
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]


def test_every_dashboard_expression_names_only_metrics_that_exist(
    dashboard: Any, exported: dict[str, str]
) -> None:
    known = sample_names(exported)
    missing = {
        (title, name) for title, expr in targets(dashboard) for name in names_in(expr) - known
    }
    assert not missing, sorted(missing)
    assert all(names_in(expr) for _, expr in targets(dashboard))


def test_every_exported_metric_is_on_the_dashboard_and_in_the_docs(
    dashboard: Any, exported: dict[str, str]
) -> None:
    on_dashboard = {name for _, expr in targets(dashboard) for name in names_in(expr)}
    documented = documented_names()
    for name, kind in exported.items():
        if not name.startswith("jobrun_"):
            continue
        samples = {name + suffix for suffix in SUFFIXES[kind]}
        assert samples & on_dashboard, f"{name} is on no dashboard panel"
        expected = name + "_total" if kind == "counter" else name
        assert expected in documented, f"{expected} is not in docs/metrics.md"


def test_the_docs_name_only_metrics_that_exist(exported: dict[str, str]) -> None:
    exported_names = {n + ("_total" if k == "counter" else "") for n, k in exported.items()}
    assert documented_names() - exported_names == set()
    assert len(documented_names()) == len([n for n in exported if n.startswith("jobrun_")])


def documented_names() -> set[str]:
    """The names in the reference tables of docs/metrics.md (rows starting with a name)."""
    rows = [line for line in DOCS.read_text().splitlines() if line.startswith("| `jobrun_")]
    return {line.split("`")[1] for line in rows}


def test_the_name_check_catches_a_metric_that_does_not_exist() -> None:
    """Not vacuous: a misspelt name and a suffix on the wrong type are both caught."""
    known = sample_names({"jobrun_jobs_started": "counter", "jobrun_queue_jobs": "gauge"})
    assert names_in("sum(rate(jobrun_jobs_startd_total[5m]))") - known == {
        "jobrun_jobs_startd_total"
    }
    assert names_in("jobrun_queue_jobs_total") - known == {"jobrun_queue_jobs_total"}
    assert names_in('rate(jobrun_jobs_started_total{queue=~"$queue"}[$__rate_interval])') <= known
