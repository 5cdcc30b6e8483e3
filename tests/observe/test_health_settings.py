"""The observability settings: read from the environment, validated naming their variable."""

from __future__ import annotations

import datetime as dt

import pytest

from jobrun import cli
from jobrun.config import Settings
from jobrun.job.errors import ValidationError
from jobrun.observe.health import Health, default_stale_after

APP = "tests.acceptance.lifecycle_app:registry"


def test_nothing_is_served_or_traced_by_default() -> None:
    settings = Settings.from_env({})
    assert settings.metrics_port is None
    assert settings.health_port is None
    assert settings.tracing == "off"
    assert settings.health_stale_after is None
    assert settings.observe_host == "0.0.0.0"


def test_the_environment_sets_every_observability_setting() -> None:
    settings = Settings.from_env(
        {
            "JOBRUN_METRICS_PORT": "9464",
            "JOBRUN_HEALTH_PORT": " 8080 ",
            "JOBRUN_OBSERVE_HOST": "127.0.0.1",
            "JOBRUN_HEALTH_STALE_AFTER": "90s",
            "JOBRUN_TRACING": "OTel",
        }
    )
    assert settings.metrics_port == 9464
    assert settings.health_port == 8080
    assert settings.observe_host == "127.0.0.1"
    assert settings.health_stale_after == dt.timedelta(seconds=90)
    assert settings.tracing == "otel"
    assert Settings.from_env({"JOBRUN_METRICS_PORT": "off"}).metrics_port is None
    assert Settings.from_env({"JOBRUN_HEALTH_PORT": "0"}).health_port == 0  # any free port
    for host in ("::1", "[::1]", "localhost", "metrics.internal"):
        assert Settings.from_env({"JOBRUN_OBSERVE_HOST": host}).observe_host == host


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("JOBRUN_METRICS_PORT", "abc"),
        ("JOBRUN_METRICS_PORT", "70000"),
        ("JOBRUN_HEALTH_PORT", "-1"),
        ("JOBRUN_HEALTH_PORT", "80.5"),
        ("JOBRUN_TRACING", "zipkin"),
        ("JOBRUN_OBSERVE_HOST", "two words"),
        ("JOBRUN_OBSERVE_HOST", "http://x/"),
        ("JOBRUN_HEALTH_STALE_AFTER", "soon"),
        ("JOBRUN_HEALTH_STALE_AFTER", "0s"),
    ],
)
def test_a_bad_value_is_a_validation_error_naming_its_variable(variable: str, value: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings.from_env({variable: value})
    assert caught.value.field == variable


def test_settings_made_in_code_are_validated_too() -> None:
    with pytest.raises(ValidationError, match="JOBRUN_METRICS_PORT"):
        Settings(metrics_port=True)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="JOBRUN_TRACING"):
        Settings(tracing="jaeger")


def test_a_bad_port_flag_ends_the_command_with_the_validation_exit_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(
        ["worker", "--app", APP, "--metrics-port", "70000", "--database-url", "postgresql://h/db"]
    )
    assert code == cli.EXIT_VALIDATION
    assert capsys.readouterr().err.startswith("jobrun: JOBRUN_METRICS_PORT: 70000 is not a port")


def test_the_liveness_bound_defaults_to_two_lease_ttls_and_three_poll_intervals() -> None:
    seconds = dt.timedelta(seconds=1)
    assert default_stale_after(30 * seconds, 1 * seconds) == 60
    assert default_stale_after(3 * seconds, 5 * seconds) == 15
    with pytest.raises(ValidationError, match="stale_after"):
        Health(stale_after=0)
    with pytest.raises(ValidationError, match="check_timeout"):
        Health(check_timeout=-1)
    assert Health(stale_after=dt.timedelta(minutes=2)).stale_after == 120
    assert Health().stale_after is None  # until a worker is watched


def test_a_process_with_nothing_to_watch_is_live_and_ready() -> None:
    health = Health()
    assert health.liveness().ok and str(health.liveness()) == "ok"
    assert health.readiness().ok
    health.mark_stopping()
    assert health.liveness().ok
    assert str(health.readiness()) == "stopping"
