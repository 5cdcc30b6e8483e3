"""A worker never holds more leases than its threads plus the completion allowance.

The claimer's lanes plan their claims from a reading of the worker's
holdings, then send them; two lanes planning at once read the same room.
The jobs a claim asks for ahead (into the buffer) are therefore reserved
under the holdings' lock at send time (``Leases.take_ahead``), counting
every round still on its way, and handed to the buffer in one step when
the claim is back. The fault suite saw the bound broken before (220 leases
for 8 threads and an allowance of 200), with two lanes and a deep buffer.
"""

from __future__ import annotations

from jobrun.job.model import Job, State
from jobrun.worker.leases import Leases
from tests.support.jobs import leased_job

THREADS, ALLOWANCE = 8, 200


def leases() -> Leases:
    return Leases(["q"], 30.0, concurrency=THREADS, allowance=ALLOWANCE)


def leased(n: int) -> list[Job]:
    return [leased_job(state=State.LEASED, attempts=0) for _ in range(n)]


def test_two_lanes_sending_at_once_share_one_bound() -> None:
    held = leases()
    first = (held.take_threads(THREADS), held.take_ahead(1_000))
    second = (held.take_threads(THREADS), held.take_ahead(1_000))
    assert first == (THREADS, ALLOWANCE)
    assert second == (0, 0)  # the first lane's round, on its way, fills the room


def test_a_claim_back_moves_its_reservation_into_the_buffer_in_one_step() -> None:
    held = leases()
    held.take_threads(0)
    asked = held.take_ahead(50)
    got = leased(30)  # fewer came back than were asked for
    held.buffer(got, asked=asked)
    holdings = held.holdings()
    assert (holdings.buffered, holdings.claiming_ahead) == (30, 0)
    assert held.take_ahead(1_000) == THREADS + ALLOWANCE - 30


def test_a_claim_that_failed_gives_its_reservation_back() -> None:
    held = leases()
    asked = held.take_ahead(100)
    held.claiming(-asked)
    assert held.take_ahead(1_000) == THREADS + ALLOWANCE
