"""The error tree drawn in jobrun/job/errors.py is the tree the classes form.

The drawing is what a reader trusts to know what an ``except`` catches, so it
is compared with the classes themselves: every class drawn exists, sits under
the parent drawn, and every subclass of a drawn root (in any jobrun module)
is drawn. A class added, moved or re-parented without its line fails here.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import jobrun.job.errors as errors

ROOT = Path(__file__).resolve().parents[2]

Edge = tuple[str, str]

_ROOT_LINE = re.compile(r"^(\w+)(?:\s{2,}.*)?$")
_CHILD_LINE = re.compile(r"^((?:│   |    )*)(?:├── |└── )(\w+)")


def drawn_tree(docstring: str) -> tuple[list[str], set[Edge]]:
    """The roots and (parent, child) edges of the first ``::`` block of ``docstring``."""
    lines = docstring.splitlines()
    start = next(i for i, line in enumerate(lines) if line.rstrip().endswith("::")) + 1
    block: list[str] = []
    for line in lines[start:]:
        if line.strip() and not line.startswith(" "):
            break
        block.append(line)
    indent = min(len(line) - len(line.lstrip()) for line in block if line.strip())
    roots: list[str] = []
    edges: set[Edge] = set()
    stack: list[str] = []  # the ancestors of the next line, by depth
    for raw in block:
        line = raw[indent:].rstrip()
        if not line:
            continue
        child = _CHILD_LINE.match(line)
        if child:
            depth = len(child.group(1)) // 4 + 1
            assert 0 < depth <= len(stack), f"a line drawn deeper than its parent: {raw!r}"
            del stack[depth:]
            edges.add((stack[-1], child.group(2)))
            stack.append(child.group(2))
            continue
        root = _ROOT_LINE.match(line)
        if root and not line.startswith((" ", "│")):
            roots.append(root.group(1))
            stack = [root.group(1)]
            continue
        # a description carried on: only the gutter before it
        assert line.startswith((" ", "│")), f"unreadable line: {raw!r}"
    return roots, edges


def _load_every_subclass_module() -> None:
    """Import each jobrun module that subclasses an error of errors.py by name, so
    that ``__subclasses__`` sees classes defined outside errors.py too."""
    names = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, BaseException)
    }
    for path in sorted((ROOT / "jobrun").rglob("*.py")):
        if "sqlc" in path.parts or path.name == "errors.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {
                b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
            }
            if bases & names:
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                importlib.import_module(module.removesuffix(".__init__"))
                break


def real_tree(roots: list[str]) -> set[Edge]:
    """The (parent, child) edges below ``roots`` among jobrun's own classes."""
    _load_every_subclass_module()
    edges: set[Edge] = set()
    todo = [getattr(errors, name) for name in roots]
    while todo:
        parent = todo.pop()
        for child in parent.__subclasses__():
            if child.__module__.split(".")[0] != "jobrun":
                continue  # a test's own subclass
            edges.add((parent.__name__, child.__name__))
            todo.append(child)
    return edges


def test_the_drawing_is_the_class_tree() -> None:
    assert errors.__doc__ is not None
    roots, drawn = drawn_tree(errors.__doc__)
    assert roots, "no tree drawn in jobrun/job/errors.py"
    assert "JobrunError" in roots
    for name in roots:
        cls = getattr(errors, name, None)
        assert isinstance(cls, type), f"{name} is drawn but errors.py defines no such class"
        above = [b.__name__ for b in cls.__mro__[1:] if b.__module__ == errors.__name__]
        assert not above, f"{name} is drawn as a root but derives from {above}"
    real = real_tree(roots)
    assert drawn - real == set(), "drawn (parent, child) pairs the classes do not have"
    assert real - drawn == set(), "subclasses the drawing leaves out (or puts elsewhere)"


def test_a_wrong_drawing_is_caught() -> None:
    # main's drawing before issue 26: LeaderLost outside JobrunError,
    # ConnectionUnavailable missing.
    wrong = """The tree::

    JobrunError
    ├── LeaseLost              the fence
    └── DatabaseError          the database could not do it
        └── TransientError     retry later
    LeaderLost                 the term ended
"""
    roots, drawn = drawn_tree(wrong)
    assert roots == ["JobrunError", "LeaderLost"]
    assert drawn == {
        ("JobrunError", "LeaseLost"),
        ("JobrunError", "DatabaseError"),
        ("DatabaseError", "TransientError"),
    }
    real = real_tree(roots)
    assert ("JobrunError", "LeaderLost") in real - drawn
    assert ("TransientError", "ConnectionUnavailable") in real - drawn
    assert issubclass(errors.LeaderLost, errors.JobrunError)  # so it is no root
