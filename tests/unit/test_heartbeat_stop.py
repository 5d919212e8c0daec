"""A worker's heartbeat thread ends when asked, not when its wait for replies runs out (psrv/client/heartbeat.py):
each psrv.Worker's close waited for it, 25 ms on average, once per worker in every run and matrix case."""
import socket
import time

import psrv.client.heartbeat as heartbeat
from psrv.client.heartbeat import Heartbeat


def _free_address() -> str:
    with socket.socket() as s:  # nobody listens there: the beats wait in the socket's queue, unanswered
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_stop_ends_the_thread_inside_its_wait_for_replies(monkeypatch) -> None:
    monkeypatch.setattr(heartbeat, "RECV_WAIT", 60.0)  # a wait that only the wake-up can cut short
    beat = Heartbeat([_free_address()], worker=0, interval=60.0)
    beat.start()
    time.sleep(0.5)  # into its wait (were it not yet, the case would pass on a heartbeat without the wake-up)
    beat.stop(timeout=10.0)
    assert not beat.is_alive()


def test_stop_after_the_thread_ended_and_before_it_started_is_harmless(monkeypatch) -> None:
    beat = Heartbeat([_free_address()], worker=0, interval=1.0)
    beat.stop(timeout=1.0)  # never started: nothing to wait for
    beat.start()
    beat.stop(timeout=10.0)
    beat.signal()  # its wake-up socket closed with it
    assert not beat.is_alive()
