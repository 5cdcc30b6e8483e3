"""jobrun side by side with PgQueuer and procrastinate (issue 17): ``make bench-peers``.

The orchestrator (``python -m bench.peers``, :mod:`bench.peers.run`) runs in
jobrun's ``.venv``; the peers live in ``.venv-peers`` and are only ever
imported by the subprocesses that run there. So nothing in this package's
``__init__`` (nor in :mod:`bench.peers.common` or :mod:`bench.peers.launch`)
may import jobrun, PgQueuer or procrastinate: both interpreters import it.
See bench/README.md, "Side by side".
"""
