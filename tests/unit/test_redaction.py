"""The one redactor, and connection strings as users paste them (no server needed).

Every test plants a canary password and looks for it in what comes out.
"""

from __future__ import annotations

import io
import logging
import os
import secrets
import traceback
import urllib.parse

import psycopg.conninfo
import pytest

from jobrun.config import Settings
from jobrun.job import validate
from jobrun.job.errors import ValidationError
from jobrun.job.redaction import RedactingFormatter, redact
from jobrun.postgres import dsn
from jobrun.postgres.pool import conninfo_with, describe

CANARY = f"canary{(os.environ.get('PYTEST_XDIST_TESTRUNUID') or secrets.token_hex(6))[:12]}"
"""The distinctive part of every password here: no encoding changes it.

Random per run, the same in every pytest-xdist worker of a run (it is in
the test ids, which the workers must agree on).
"""


def _kv_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _forms(password: str) -> dict[str, str]:
    """One DSN in every form a user may paste, each with ``password``."""
    enc = urllib.parse.quote(password, safe="")
    return {
        "url": f"postgresql://app:{enc}@db.internal:5433/app",
        "postgres-scheme": f"postgres://app:{enc}@db.internal:5433/app",
        "sqlalchemy-psycopg": f"postgresql+psycopg://app:{enc}@db.internal:5433/app",
        "sqlalchemy-psycopg2": f"postgresql+psycopg2://app:{enc}@db.internal:5433/app",
        "sqlalchemy-asyncpg": f"postgresql+asyncpg://app:{enc}@db.internal:5433/app?ssl=require",
        "raw-url": f"postgresql://app:{password}@db.internal:5433/app",
        "keywords": (
            f"host=db.internal port=5433 dbname=app user=app password={_kv_quote(password)}"
        ),
        "keywords-spaced": (
            f"host = db.internal user=app password = {_kv_quote(password)} port=5433 dbname=app"
        ),
        "query-password": f"postgresql://app@db.internal:5433/app?password={enc}&sslmode=disable",
    }


PASSWORDS = {
    "plain": CANARY,
    "spaces": f"a b {CANARY} c",
    "at-signs": f"p@ss@{CANARY}",
    "percent": f"50%off%zz{CANARY}%2",
    "quotes": f"a b' {CANARY} \\ c\"",
    "slash-query-hash": f"x/{CANARY}?y#z",
}

FORMS = [
    pytest.param(name, form, id=f"{pw_name}-{name}")
    for pw_name, password in PASSWORDS.items()
    for name, form in _forms(password).items()
]

OTHER_SCHEMES = [
    f"mysql://u:{CANARY}@db/app",
    f"mysql+pymysql://u:{CANARY}@db:3306/app",
    f"redis://:{CANARY}@cache:6379/0",
    f"amqp://guest:{CANARY}@mq//",
    f"https://user:{CANARY}@example.com/x",
]


@pytest.mark.parametrize(("name", "form"), FORMS)
def test_redact_masks_the_password_of_every_dsn_form_in_free_text(name: str, form: str) -> None:
    text = f"could not reach {form}\nTraceback (most recent call last):\n  boom: {form} (again)"
    out = redact(text)
    assert CANARY not in out
    assert out.startswith("could not reach ")
    assert "Traceback (most recent call last):" in out


BENIGN = [
    "https://docs.python.org/3/library/re.html#re.sub",
    "http://localhost:8080/health?verbose=1",
    "postgresql://db1:5432,db2:5433/app?target_session_attrs=read-write",
    "postgresql://[::1]:5432/app",
    "postgresql://app@db/app",
    'FATAL:  password authentication failed for user "app"',
    "fe_sendauth: no password supplied",
    "wrong password: try again",
    'File "/srv/app/jobs.py", line 12, in send',
    "mail ops@example.com about http://status.example.com/",
]
"""Texts without a password: the redactor leaves them as they are."""


@pytest.mark.parametrize("text", OTHER_SCHEMES)
def test_redact_masks_passwords_of_any_url_scheme_and_nothing_else(text: str) -> None:
    lines = [*BENIGN, f"upstream failed: {text} refused", *BENIGN]
    out = redact("\n".join(lines)).splitlines()
    assert CANARY not in "\n".join(out)
    assert out[len(BENIGN)].startswith("upstream failed: ") and "***" in out[len(BENIGN)]
    assert out[: len(BENIGN)] == BENIGN and out[len(BENIGN) + 1 :] == BENIGN


@pytest.mark.parametrize(
    "text",
    [
        f"{{'user': 'app', 'password': '{CANARY}', 'host': 'db'}}",
        f"{{'password': \"it's {CANARY}\"}}",
        f'{{"user": "app", "password": "x\\"{CANARY}"}}',
        f"PGPASSWORD={CANARY} psql -h db",
        f"connect(host='db', password='{CANARY}')",
        f"sslpassword={CANARY} sslmode=verify-full",
        f"Password = {CANARY}",
        f"host=db password='unterminated {CANARY}",
        f"postgresql://app:{CANARY}",  # cut short: no host in sight
        f"jdbc:postgresql://db/app?user=app&password={CANARY}",
        f"Server=db;Database=app;User Id=app;Pwd={CANARY};",
        f"oauth_client_secret={CANARY}",
        f"İstanbul DB: postgresql+psycopg://app:{CANARY}@db/app, ΣΊΣΥΦΟΣ password={CANARY}",
    ],
)
def test_redact_masks_passwords_in_parameter_lists_reprs_and_cut_texts(text: str) -> None:
    assert CANARY not in redact(text)


def test_a_long_traceback_quoting_many_dsns_is_masked_line_by_line_and_capped() -> None:
    forms = list(_forms(PASSWORDS["quotes"]).values())
    lines = [f"  frame {i}: {forms[i % len(forms)]} failed" for i in range(300)]
    stored = validate.error_text("\n".join(lines))
    assert CANARY not in stored
    assert stored.splitlines()[0] == "  frame 0: postgresql://app:***@db.internal:5433/app failed"
    assert len(stored) <= validate.MAX_ERROR_CHARS
    huge = validate.error_text(f"{forms[2]} " + "x" * 10_000_000)
    assert CANARY not in huge and len(huge) <= validate.MAX_ERROR_CHARS


def test_redact_masks_known_secrets_wherever_they_appear() -> None:
    message = f'could not translate host name "{CANARY}x" to address'
    assert CANARY not in redact(message, [CANARY])


@pytest.mark.parametrize(("name", "form"), FORMS)
def test_a_handler_error_quoting_its_dsn_is_stored_without_the_password(
    name: str, form: str
) -> None:
    try:
        try:
            raise ValueError(f"inner: {form}")
        except ValueError as inner:
            raise RuntimeError(f"cannot reach {form}") from inner
    except RuntimeError as exc:
        stored = validate.error_text(
            f"RuntimeError: {exc}\n{''.join(traceback.format_exception(exc))}"
        )
    assert CANARY not in stored
    assert stored.startswith("RuntimeError: cannot reach ")


def test_log_lines_and_their_tracebacks_go_through_the_redactor() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    known: list[str] = []
    handler.setFormatter(RedactingFormatter("%(levelname)s %(message)s", known=known))
    logger = logging.getLogger("tests.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        known.append(f"{CANARY}-in-no-form")
        logger.warning("connecting to %s", f"postgresql+psycopg://app:{CANARY}@db/app")
        logger.warning("the bare secret: %s", f"{CANARY}-in-no-form")
        try:
            raise RuntimeError(f"host=db password='{CANARY}'")
        except RuntimeError:
            logger.exception("handler failed")
    finally:
        logger.removeHandler(handler)
    said = stream.getvalue()
    assert "connecting to" in said and "handler failed" in said and "Traceback" in said
    assert CANARY not in said


# -- connection strings: accepted forms, normalised for libpq ----------------------------


@pytest.mark.parametrize("password", list(PASSWORDS.values()), ids=list(PASSWORDS))
@pytest.mark.parametrize(
    "name",
    [
        "url",
        "postgres-scheme",
        "sqlalchemy-psycopg",
        "sqlalchemy-psycopg2",
        "sqlalchemy-asyncpg",
        "raw-url",
        "keywords",
        "keywords-spaced",
        "query-password",
    ],
)
def test_every_accepted_dsn_form_means_the_same_connection(name: str, password: str) -> None:
    params = dsn.parse(_forms(password)[name])
    assert params["password"] == password
    assert (params["user"], params["host"], params["port"], params["dbname"]) == (
        "app",
        "db.internal",
        "5433",
        "app",
    )
    if name == "sqlalchemy-asyncpg":
        assert params["sslmode"] == "require"
    full = conninfo_with(_forms(password)[name])  # what the pool and ping connect with
    assert psycopg.conninfo.conninfo_to_dict(full)["password"] == password
    assert describe(_forms(password)[name]) == "app@db.internal:5433/app"
    if name in ("url", "postgres-scheme", "keywords", "keywords-spaced", "query-password"):
        assert dsn.normalize(_forms(password)[name]) == _forms(password)[name]  # libpq's own


@pytest.mark.parametrize("text", [*OTHER_SCHEMES[:2], f"postgresql+nodriver://u:{CANARY}@db/app"])
def test_a_url_of_another_scheme_is_refused_by_name_without_the_password(text: str) -> None:
    with pytest.raises(ValidationError) as info:
        conninfo_with(text)
    assert info.value.field == "DATABASE_URL"
    assert "is not a PostgreSQL URL" in str(info.value)
    assert CANARY not in str(info.value) and CANARY not in repr(info.value)


GARBAGE = [
    f"postgresql://app:{CANARY}@[::1/app",
    f"postgresql://app:{CANARY}@db/app?bogus_option=1",
    f"postgresql://app@db/app?password={CANARY}&nope",
    f"postgresql://app@db/app?password={CANARY}%zz",
    f"host=db password={CANARY} =broken",
    f"host=db password='{CANARY}",
    f"host=db {CANARY}",
    f"{CANARY}",
    f"postgresql://app:{CANARY}@db/app?sslmode=require=x",
    f" {CANARY} postgresql://app:{CANARY}@db/app",
]


@pytest.mark.parametrize("text", GARBAGE)
def test_an_unparseable_dsn_is_a_validation_error_quoting_nothing_of_it(text: str) -> None:
    with pytest.raises(ValidationError) as info:
        conninfo_with(text)
    error = info.value
    said = [str(error), repr(error), "".join(traceback.format_exception(error))]
    chained: BaseException | None = error
    while chained is not None:
        said.append(repr(chained))
        chained = chained.__cause__ or chained.__context__
    assert error.field == "DATABASE_URL"
    assert CANARY not in "\n".join(said)
    assert describe(text) == "<unparseable connection string>"
    if "bogus_option" in text:  # the names of parameters are no secret: still said
        assert '"bogus_option"' in str(error)


@pytest.mark.parametrize(("name", "form"), FORMS)
def test_settings_repr_and_str_never_show_the_password(name: str, form: str) -> None:
    settings = Settings.from_env({"DATABASE_URL": form})
    assert settings.database_url == form  # kept as given; only its printed forms are masked
    for shown in (repr(settings), str(settings), f"{settings}", repr([settings])):
        assert CANARY not in shown
        assert "database_url=" in shown and "concurrency=" in shown
