"""``make bench`` / ``python -m bench``: measure jobrun, print a table, append JSON lines.

Options::

    --quick               small sizes, 1 run (what the test suite runs)
    --only NAME[,NAME]    some measurements only (ceiling, enqueue_one,
                          enqueue_batch, drain, drain_tx, worker_rss, observed,
                          limits, limits_claim, pickup, growth, dashboard,
                          sustained, workflows);
                          the ceiling runs first whenever selected
    --runs N              runs per figure (default 3, quick 1)
    --size NAME=VALUE     override one size (repeatable; see bench.measure.Sizes)
    --set NAME=VALUE      a server setting of the embedded cluster (repeatable)
    --out DIR             where the JSONL goes (default bench/results)
    --statements          diagnosis: pg_stat_statements on (embedded: preloaded);
                          each drain records its top statements by server time

``DATABASE_URL`` set: a fresh database on that server instead of the
embedded cluster. See bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import measure, server
from bench.stats import Figure

RESULTS = server.ROOT / "bench" / "results"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, 1 run")
    p.add_argument("--only", metavar="NAME[,NAME]", help=", ".join(measure.MEASUREMENTS))
    p.add_argument("--runs", type=int, help="runs per figure (default 3; --quick: 1)")
    p.add_argument("--size", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", dest="settings")
    p.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSONL file")
    p.add_argument(
        "--statements",
        action="store_true",
        help="diagnosis: record each drain's top statements (pg_stat_statements)",
    )
    args = p.parse_args(argv)
    names = list(measure.MEASUREMENTS)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in measure.MEASUREMENTS]
        if unknown:
            p.error(f"unknown measurement(s) {', '.join(unknown)}; choose from {', '.join(names)}")
        names = [n for n in names if n in wanted]
    args.names = names
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.runs < 1:
        p.error("--runs must be at least 1")
    sizes = dataclasses.replace(measure.QUICK if args.quick else measure.Sizes())
    try:
        for assignment in args.size:
            sizes.set(assignment)
    except ValueError as exc:
        p.error(str(exc))
    args.sizes = sizes
    extra = {}
    for assignment in args.settings:
        name, _, value = assignment.partition("=")
        if not name or not value:
            p.error(f"--set {assignment!r}: expected NAME=VALUE")
        extra[name.strip()] = value.strip()
    if args.statements:
        extra.setdefault("shared_preload_libraries", "pg_stat_statements")
        extra.setdefault("pg_stat_statements.track_planning", "on")
    args.extra_settings = extra
    return args


def _fmt(value: float, unit: str) -> str:
    if unit in ("ms", "x", "cores"):
        return f"{value:,.2f}"
    if unit == "MB":
        return f"{value:,.0f}"
    if unit == "nodes":
        return f"{value:g}"
    return f"{value:,.0f}"


def table(figures: list[Figure], title: str) -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column("measurement")
    t.add_column("median", justify="right")
    t.add_column("min", justify="right")
    t.add_column("max", justify="right")
    t.add_column("unit")
    t.add_column("runs", justify="right")
    t.add_column("x ceiling", justify="right")
    t.add_column("target")
    t.add_column("", justify="center")
    for f in figures:
        verdict = f.verdict or ""
        style = {"PASS": "green", "MISS": "bold red"}.get(verdict, "")
        t.add_row(
            f.name,
            _fmt(f.median, f.unit),
            _fmt(f.min, f.unit),
            _fmt(f.max, f.unit),
            f.unit,
            str(len(f.values)),
            f"{f.ratio:.2f}" if f.ratio is not None else "",
            f.target.text if f.target else "",
            f"[{style}]{verdict}[/{style}]" if style else verdict,
        )
    return t


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=150)
    started_at = dt.datetime.now(dt.UTC)
    url = os.environ.get("DATABASE_URL") or None
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{started_at:%Y%m%dT%H%M%SZ}.jsonl"
    figures: list[Figure] = []
    failed: list[str] = []
    clock = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="jobrun-bench-") as workdir,
        server.database(url, args.extra_settings) as db,
    ):
        if args.statements and not db.enable_statements():
            console.print("[yellow]pg_stat_statements is not available: --statements ignored")
        common: dict[str, Any] = {
            "timestamp": started_at.isoformat(),
            "postgres": db.info(),
            "machine": server.machine(),
            "jobrun": server.code(),
            "options": {
                "quick": args.quick,
                "runs": args.runs,
                "only": args.names,
                "statements": db.statements,
                "sizes": dataclasses.asdict(args.sizes),
            },
        }
        pg = common["postgres"]
        console.print(
            f"[bold]jobrun bench[/bold]: PostgreSQL {pg['version']} ({pg['source']}), "
            + ", ".join(f"{k}={v}" for k, v in pg["settings"].items())
        )
        m = common["machine"]
        console.print(
            f"machine: {m['cpu_count']} CPU {m['cpu_model']}, {m['ram_gb']} GB, "
            f"kernel {m['kernel']}; load {m['loadavg_at_start'][0]}; runs per figure: {args.runs}"
        )
        if m["loadavg_at_start"][0] > 0.5 * (m["cpu_count"] or 1):
            console.print(
                f"[yellow]the machine is busy (load {m['loadavg_at_start'][0]}): "
                "the figures will be noisy"
            )
        store = measure.open_store(db.dsn)
        ctx = measure.Context(db, args.sizes, args.runs, console, Path(workdir), store)
        ceiling: float | None = None
        try:
            for name in args.names:
                console.print(f"[bold]{name}[/bold]")
                t0 = time.monotonic()
                try:
                    got = measure.MEASUREMENTS[name](ctx)
                except Exception:
                    failed.append(name)
                    console.print(f"[red]{name} failed:[/red]\n{traceback.format_exc()}")
                    continue
                for f in got:
                    if f.name == "ceiling":
                        ceiling = f.median
                    if f.throughput and ceiling:
                        f.ratio = f.median / ceiling
                with path.open("a") as out:
                    for f in got:
                        out.write(json.dumps({**f.record(), **common}, default=str) + "\n")
                figures.extend(got)
                ctx.say(f"{name}: {time.monotonic() - t0:.0f} s")
        finally:
            store.pool.close()
    console.print()
    console.print(
        table(figures, f"jobrun bench: medians of {args.runs} run(s) (jobs/s unless stated)")
    )
    verdicts = [f for f in figures if f.verdict in ("PASS", "MISS")]
    met = sum(1 for f in verdicts if f.verdict == "PASS")
    console.print(f"targets met: {met} of {len(verdicts)}; took {time.monotonic() - clock:.0f} s")
    console.print(f"results: {path}")
    for failure in ctx.failures:
        console.print(f"[red]failed: {failure.splitlines()[0]}[/red]")
    if failed:
        console.print(f"[red]failed: {', '.join(failed)}[/red]")
    if failed or ctx.failures:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
