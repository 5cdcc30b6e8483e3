"""A child's parents reach its handler as the claim read them, decoded only when read."""

import json
import uuid

import pytest

from jobrun.job.model import State
from jobrun.job.workflow import ParentResult, ParentResults


def _stored(*parents: ParentResult) -> str:
    """The claim's form: a JSON array of the parents, in id order."""
    return json.dumps(
        [
            {
                "id": str(p.id),
                "type": p.type,
                "node": p.node,
                "state": p.state.value,
                "result": p.result,
                "error": p.error,
            }
            for p in parents
        ]
    )


def test_parents_read_from_the_claims_text_equal_the_same_parents_built_at_once() -> None:
    a = ParentResult(id=uuid.uuid4(), type="fetch", node="a", state=State.SUCCEEDED, result=[1, 2])
    b = ParentResult(id=uuid.uuid4(), type="fetch", node=None, state=State.DEAD, error="boom")
    later = ParentResults.decoded_later(_stored(a, b))
    assert later == ParentResults([a, b])
    assert later["a"].result == [1, 2]
    assert later[b.id] == b
    assert list(later) == ["a", str(b.id)]
    assert later.of("fetch") == [[1, 2]]
    assert later.failed == [b]
    assert len(later) == 2


def test_a_handler_that_never_reads_its_parents_never_decodes_them() -> None:
    # Nothing is decoded when the job is built from the claim's row, only on
    # the first read: text that is not JSON fails there and not before.
    later = ParentResults.decoded_later("not json")
    with pytest.raises(ValueError):
        len(later)
