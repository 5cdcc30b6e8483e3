"""MkDocs hook: links from a page to repository files outside docs/ are checked.

The pages link to code, examples and tools by relative path (``../bench/README.md``),
which reads well on GitHub but is no page of the site. The target must exist
(a moved file fails the build, like a broken link between pages); on the site
the link points at the repository when ``repo_url`` is set in mkdocs.yml, and
is plain text otherwise.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    page_dir = posixpath.dirname(page.file.src_uri)
    repo_url = (config.get("repo_url") or "").rstrip("/")

    def rewrite(m: re.Match[str]) -> str:
        bang, text, target = m.groups()
        if "://" in target or target.startswith(("#", "mailto:")):
            return m.group(0)
        path, _, fragment = target.partition("#")
        resolved = posixpath.normpath(posixpath.join("docs", page_dir, path))
        if resolved == "docs" or resolved.startswith("docs/"):
            return m.group(0)  # a page of the site: MkDocs validates it
        if resolved.startswith("..") or not (root / resolved).exists():
            raise PluginError(f"{page.file.src_uri}: links to {target}, which does not exist")
        if bang or not repo_url:
            return text
        anchor = f"#{fragment}" if fragment else ""
        return f"[{text}]({repo_url}/blob/HEAD/{resolved}{anchor})"

    return _LINK.sub(rewrite, markdown)
