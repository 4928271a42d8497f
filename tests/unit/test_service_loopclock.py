"""The event loop's busy share (SVC-41's loop term), measured by the selector of the loop
``tidelog serve`` makes (service/loopclock.py)."""

from __future__ import annotations

import asyncio
import time

from tidelog.service.loopclock import BusyMeter, new_loop


def test_SVC_41_the_busy_share_is_the_time_not_spent_waiting_for_io() -> None:
    """SVC-41: a loop that computes for 150 ms and then sleeps 150 ms was busy about half of
    the time; one that only sleeps, close to none of it; a loop the service did not make is
    not measured (None: the term is 0)."""

    async def work(spin: float, sleep: float) -> float | None:
        meter = BusyMeter(asyncio.get_running_loop())
        end = time.monotonic() + spin
        while time.monotonic() < end:
            pass
        await asyncio.sleep(sleep)
        return meter.share()

    with asyncio.Runner(loop_factory=new_loop) as runner:
        half = runner.run(work(0.15, 0.15))
        idle = runner.run(work(0.0, 0.3))
    assert half is not None and 0.35 < half < 0.65
    assert idle is not None and idle < 0.2
    assert asyncio.run(work(0.0, 0.01)) is None
