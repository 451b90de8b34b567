"""Days-long jobs (issue 28, issue 40): the background writer waits for a writer that keeps finishing
windows, and still abandons one that is stuck, within its timeout."""

from __future__ import annotations


def test_a_writer_slower_than_the_windows_is_waited_for_not_abandoned():
    """Issue 40: back-pressure from a writer that keeps finishing windows is not a stuck writer.
    Every wait used to spend from one allowance per run, so after writer_timeout of short waits in
    all (window ~1,200 of the long-run benchmark) each window that found the writer busy was
    dropped and the writer killed. Here: 12 jobs of 0.1 s, training waiting for room before each,
    1.2 s of waits in all against a 0.5 s writer_timeout."""
    import time

    from vt_lightning.controller.handoff import BackgroundWriter

    writer = BackgroundWriter(max_in_flight=1, use_process=False, timeout=0.5)
    try:
        done = []
        waited = 0.0
        for index in range(12):
            seconds, room = writer.wait_for_room()
            assert room, f"job {index} found no room after {waited:.2f} s of waits in all"
            waited += seconds
            writer.submit(lambda index=index: (time.sleep(0.1), done.append(index)))
        assert writer.drain() is True
        assert waited > writer.timeout  # the waits together passed the timeout: each was short
        assert done == list(range(12)) and writer.abandoned == 0
    finally:
        writer.close()


def test_a_writer_stuck_after_finishing_windows_is_still_abandoned_within_its_timeout():
    import threading
    import time

    from vt_lightning.controller.handoff import BackgroundWriter

    release = threading.Event()
    writer = BackgroundWriter(max_in_flight=1, use_process=False, timeout=0.5)
    try:
        writer.submit(lambda: None).result(timeout=10)  # it finished a window: no stall so far
        writer.submit(release.wait)  # then it hangs
        start = time.monotonic()
        _, room = writer.wait_for_room()
        assert not room and writer.abandoned == 1 and time.monotonic() - start < 5
        assert writer.drain() is True  # a fresh thread took over; nothing of it pending
    finally:
        release.set()
        writer.close()
