"""JOBRUN_CLAIM_AHEAD: the cap on jobs claimed ahead of the free threads, from
the environment to the worker's config (``--claim-ahead`` is in tests/acceptance)."""

from __future__ import annotations

import pytest

from jobrun.config import Settings
from jobrun.job import validate
from jobrun.job.errors import ValidationError


@pytest.mark.parametrize(
    ("text", "expected"), [("0", 0), (" 64 ", 64), ("auto", None), ("AUTO", None)]
)
def test_the_variable_reaches_the_worker_config(text: str, expected: int | None) -> None:
    settings = Settings.from_env({"JOBRUN_CLAIM_AHEAD": text})
    assert settings.claim_ahead == expected
    assert settings.worker_config().claim_ahead == expected


def test_unset_claims_only_for_free_threads() -> None:
    assert Settings.from_env({}).worker_config().claim_ahead == 0


def test_a_flag_beats_the_variable() -> None:
    assert Settings.from_env({"JOBRUN_CLAIM_AHEAD": "5"}, claim_ahead=0).claim_ahead == 0


def test_a_word_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValidationError) as raised:
        Settings.from_env({"JOBRUN_CLAIM_AHEAD": "lots"})
    assert raised.value.field == "JOBRUN_CLAIM_AHEAD"
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("text", ["-1", str(validate.MAX_CLAIM_LIMIT + 1)])
def test_out_of_range_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(ValidationError) as raised:
        Settings.from_env({"JOBRUN_CLAIM_AHEAD": text})
    assert raised.value.field == "claim_ahead"
    assert "\n" not in str(raised.value)
