#!/usr/bin/env python3
"""A sqlc process plugin that saves the GenerateRequest it receives.

tests/unit/sqlc_fixture/sqlc.yaml runs it so that `sqlc generate` in that
directory refreshes request.json, the saved request the unit tests feed to
tools/sqlc_gen_psycopg.py. The request is saved pretty-printed with sorted keys
(readable diffs), and without most of PostgreSQL's own catalog: sqlc sends
every table of pg_catalog and information_schema (about 1 MB), which the plugin
skips; the first table of each stays as a sample of what it skips.
"""

import base64
import json
import sys

SYSTEM_SCHEMAS = ("pg_catalog", "information_schema")


def main() -> None:
    request = json.loads(sys.stdin.buffer.read())
    for schema in request["catalog"]["schemas"]:
        if schema["name"] in SYSTEM_SCHEMAS:
            schema["tables"] = schema["tables"][:1]
    text = json.dumps(request, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    contents = base64.b64encode(text.encode()).decode()
    json.dump({"files": [{"name": "request.json", "contents": contents}]}, sys.stdout)


if __name__ == "__main__":
    main()
