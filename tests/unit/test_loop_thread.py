"""LoopThread: the one start/stop shape of the worker's and the scheduler's loop threads."""

from __future__ import annotations

import threading

from jobrun.job.service import LoopThread


class Ticker(LoopThread):
    def __init__(self, *, crash: bool = False) -> None:
        super().__init__("test-ticker")
        self.ticks = 0
        self.crash = crash
        self.ticked = threading.Event()

    def loop(self) -> None:
        while not self.stopping.wait(0.001):
            self.ticks += 1
            self.ticked.set()
            if self.crash:
                return  # ends by itself, as a loop that died would


def test_a_with_block_starts_the_loop_and_stops_it_on_the_way_out() -> None:
    with Ticker() as ticker:
        assert ticker.ticked.wait(5)
        assert ticker.thread.name == "test-ticker"
        assert ticker.thread.is_alive()
        assert not ticker.dead
    assert not ticker.thread.is_alive()
    assert ticker.stopping.is_set()


def test_start_and_stop_are_safe_twice_and_stop_is_safe_before_start() -> None:
    ticker = Ticker()
    assert ticker.stop(1.0) is True  # never started: nothing to wait for
    other = Ticker()
    other.start()
    other.start()  # a second start is a no-op, not "threads can only be started once"
    assert other.ticked.wait(5)
    assert other.stop(5.0) is True
    assert other.stop(5.0) is True


def test_a_loop_that_ended_by_itself_is_dead_and_one_asked_to_stop_is_not() -> None:
    crashed = Ticker(crash=True)
    crashed.start()
    crashed.thread.join(5)
    assert crashed.dead
    stopped = Ticker()
    stopped.start()
    stopped.stop(5.0)
    assert not stopped.dead
    assert not Ticker().dead  # never started


def test_request_stop_asks_without_waiting_and_wakes_the_loop() -> None:
    woken = threading.Event()

    class Waiting(LoopThread):
        def __init__(self) -> None:
            super().__init__("test-waiting")
            self.inbox: list[str] = []
            self.cond = threading.Condition()

        def wake(self) -> None:
            woken.set()
            with self.cond:
                self.cond.notify()

        def loop(self) -> None:
            with self.cond:
                while not self.stopping.is_set():
                    self.cond.wait()

    waiting = Waiting()
    waiting.start()
    waiting.request_stop()
    assert woken.is_set()
    assert waiting.join(5.0) is True
