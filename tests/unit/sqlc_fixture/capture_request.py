#!/usr/bin/env python3
"""A sqlc process plugin that saves the GenerateRequest it receives.

tests/unit/sqlc_fixture/sqlc.yaml runs it (besides the real plugin) so that
`sqlc generate` there refreshes request.json, the saved request the unit tests
feed to tools/sqlc_gen_psycopg.py. It writes the request, pretty-printed with
sorted keys so that diffs stay readable, as a generated file `request.json`.
"""

import base64
import json
import sys


def main() -> None:
    request = json.loads(sys.stdin.buffer.read())
    text = json.dumps(request, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    contents = base64.b64encode(text.encode()).decode()
    json.dump({"files": [{"name": "request.json", "contents": contents}]}, sys.stdout)


if __name__ == "__main__":
    main()
