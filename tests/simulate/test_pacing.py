"""Sleeping a plan: tokens at their times, measured from the arrival, and cuts."""

from __future__ import annotations

import asyncio

import pytest

from titan.config import Outage, SimulationProfile
from titan.simulate import ConnectionCut, Pacer, Simulation


async def test_tokens_come_at_their_planned_times():
    profile = SimulationProfile(ttft_s=0.03, inter_token_s=0.01, output_tokens=3)
    plan = Simulation(profile, lambda: 0.0).plan()
    loop = asyncio.get_running_loop()
    start = loop.time()
    pacer = Pacer(plan)
    times = []
    for index in range(3):
        await pacer.until_token(index)
        times.append(loop.time() - start)
    await pacer.until_finish()
    assert times[0] >= 0.03 and times[2] >= 0.05
    assert times[2] < 0.05 + 0.05  # deadlines are absolute: no drift beyond scheduling noise


async def test_a_cut_comes_instead_of_the_tokens_after_it():
    profile = SimulationProfile(
        ttft_s=0.01,
        inter_token_s=0.05,
        output_tokens=10,
        outages=[Outage(start_s=0.03, duration_s=1)],
    )
    pacer = Pacer(Simulation(profile, lambda: 0.0).plan())
    await pacer.until_token(0)  # at 0.01, before the outage
    with pytest.raises(ConnectionCut):
        await pacer.until_token(1)  # due at 0.06: the outage began at 0.03
