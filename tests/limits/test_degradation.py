"""Graceful degradation: the ladder climbs one step per sustained overload, comes down one step per
sustained recovery, holds still in between, and applies each step only to its priority classes."""

from __future__ import annotations

import pydantic
import pytest

from tests.clock import ManualClock
from titan.config.admission import DegradationConfig, DegradationStep
from titan.limits.degradation import DegradationController

STEPS = [
    DegradationStep(action="fallback_model", model="small"),  # normal and batch
    DegradationStep(action="cap_max_tokens", max_tokens=64, priorities=("batch",)),
    DegradationStep(action="cache_only", priorities=("interactive", "normal", "batch")),
]


def controller(
    clock: ManualClock,
    *,
    queue_wait_p95_s: float | None = 1.0,
    ttft_p95_s: float | None = None,
    window_s: float = 2.0,
    sustain_s: float = 5.0,
) -> DegradationController:
    """A window shorter than ``sustain_s``, so each phase's samples replace the last's quickly."""
    config = DegradationConfig(
        queue_wait_p95_s=queue_wait_p95_s,
        ttft_p95_s=ttft_p95_s,
        window_s=window_s,
        sustain_s=sustain_s,
        recover_ratio=0.5,
        steps=STEPS,
    )
    return DegradationController(config, now=clock)


def run(
    ctrl: DegradationController,
    clock: ManualClock,
    seconds: int,
    *,
    queue_wait: float | None = None,
    ttft: float | None = None,
) -> list[int]:
    """Each second: advance the clock, observe the given values, update; the levels seen."""
    levels = []
    for _ in range(seconds):
        clock.now += 1.0
        if queue_wait is not None:
            ctrl.observe_queue_wait(queue_wait)
        if ttft is not None:
            ctrl.observe_ttft(ttft)
        levels.append(ctrl.update())
    return levels


def climb_to(ctrl: DegradationController, clock: ManualClock, level: int) -> None:
    run(ctrl, clock, 1 + 5 * level, queue_wait=2.0)
    assert ctrl.level == level


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


# ---- climbing ----------------------------------------------------------------------------------


def test_nothing_applies_under_the_slo(clock: ManualClock) -> None:
    ctrl = controller(clock)
    assert run(ctrl, clock, 60, queue_wait=0.9) == [0] * 60
    assert ctrl.num_changes == 0
    for priority in ("interactive", "normal", "batch"):
        assert ctrl.for_request(priority).steps == ()
    assert ctrl.snapshot()["actions"] == []


def test_sustained_overload_climbs_one_step_per_sustain(clock: ManualClock) -> None:
    ctrl = controller(clock)
    levels = run(ctrl, clock, 30, queue_wait=2.0)
    # Over from the first second on: a step after each further 5 seconds, capped at 3 steps.
    assert levels == [0] * 5 + [1] * 5 + [2] * 5 + [3] * 15
    assert ctrl.num_changes == 3
    assert ctrl.snapshot()["actions"] == ["fallback_model", "cap_max_tokens", "cache_only"]
    assert ctrl.snapshot()["queue_wait_p95_s"] == 2.0


def test_a_short_spike_does_not_climb(clock: ManualClock) -> None:
    ctrl = controller(clock)
    # Over for 2s plus the 2s the spike stays in the window: less than sustain_s.
    run(ctrl, clock, 2, queue_wait=2.0)
    run(ctrl, clock, 20, queue_wait=0.1)
    run(ctrl, clock, 2, queue_wait=2.0)
    assert ctrl.level == 0
    assert ctrl.num_changes == 0


# ---- hysteresis and recovery -------------------------------------------------------------------


def test_between_the_thresholds_nothing_changes(clock: ManualClock) -> None:
    ctrl = controller(clock)
    climb_to(ctrl, clock, 2)
    # Under the SLO (1.0) but over recover_ratio × SLO (0.5): neither climbs nor recovers.
    assert set(run(ctrl, clock, 60, queue_wait=0.8)) == {2}
    assert ctrl.num_changes == 2


def test_recovery_comes_down_one_step_per_sustain(clock: ManualClock) -> None:
    ctrl = controller(clock)
    climb_to(ctrl, clock, 3)
    levels = run(ctrl, clock, 30, queue_wait=0.2)
    # The overload samples leave the 2s window (between: 2.0 is still in it), then 5s under per
    # step down.
    assert levels[0] == 3
    assert sorted(levels, reverse=True) == levels  # never climbs back while recovering
    assert levels[-1] == 0
    changes = [i for i in range(1, len(levels)) if levels[i] != levels[i - 1]]
    assert [levels[i - 1] - levels[i] for i in changes] == [1, 1, 1]  # one step at a time
    assert changes[1] - changes[0] == 5 and changes[2] - changes[1] == 5
    assert ctrl.num_changes == 6


def test_a_relapse_during_recovery_climbs_again(clock: ManualClock) -> None:
    ctrl = controller(clock)
    climb_to(ctrl, clock, 2)
    run(ctrl, clock, 9, queue_wait=0.2)
    assert ctrl.level == 1
    levels = run(ctrl, clock, 6, queue_wait=2.0)
    assert levels == [1] * 5 + [2]


def test_no_traffic_counts_as_recovered(clock: ManualClock) -> None:
    ctrl = controller(clock)
    climb_to(ctrl, clock, 1)
    run(ctrl, clock, 20)  # no samples at all
    assert ctrl.level == 0


# ---- the window --------------------------------------------------------------------------------


def test_samples_older_than_the_window_no_longer_count(clock: ManualClock) -> None:
    ctrl = controller(clock, window_s=2.0)
    ctrl.observe_queue_wait(10.0)
    ctrl.update()  # over: the sustain starts
    clock.now += 2.0
    assert ctrl.snapshot()["queue_wait_p95_s"] == 10.0  # exactly window_s old: still in it
    clock.now += 0.5
    assert ctrl.snapshot()["queue_wait_p95_s"] is None
    clock.now += 10.0
    assert ctrl.update() == 0  # the old spike never sustained an overload


def test_p95_ignores_one_outlier_in_twenty(clock: ManualClock) -> None:
    ctrl = controller(clock, window_s=100.0)
    for _ in range(19):
        ctrl.observe_queue_wait(0.1)
    ctrl.observe_queue_wait(50.0)
    assert ctrl.snapshot()["queue_wait_p95_s"] == 0.1  # nearest rank: the 19th of 20
    ctrl.observe_queue_wait(50.0)
    assert ctrl.snapshot()["queue_wait_p95_s"] == 50.0  # 2 of 21 is more than 5%


# ---- the ttft signal ---------------------------------------------------------------------------


def test_ttft_alone_triggers(clock: ManualClock) -> None:
    ctrl = controller(clock, queue_wait_p95_s=None, ttft_p95_s=0.5)
    levels = run(ctrl, clock, 11, queue_wait=100.0, ttft=1.0)  # queue wait has no SLO here
    assert levels == [0] * 5 + [1] * 5 + [2]
    assert ctrl.snapshot()["ttft_p95_s"] == 1.0
    run(ctrl, clock, 30, queue_wait=100.0, ttft=0.1)
    assert ctrl.level == 0


def test_either_signal_over_is_overload_and_both_must_recover(clock: ManualClock) -> None:
    ctrl = controller(clock, queue_wait_p95_s=1.0, ttft_p95_s=0.5)
    run(ctrl, clock, 6, queue_wait=0.1, ttft=1.0)
    assert ctrl.level == 1
    # Queue wait well under, ttft between its thresholds (0.25 .. 0.5): no recovery.
    assert set(run(ctrl, clock, 30, queue_wait=0.1, ttft=0.4)) == {1}
    run(ctrl, clock, 30, queue_wait=0.1, ttft=0.1)
    assert ctrl.level == 0


# ---- per request -------------------------------------------------------------------------------


def test_for_request_applies_only_the_steps_of_its_class(clock: ManualClock) -> None:
    ctrl = controller(clock)
    climb_to(ctrl, clock, 1)
    assert ctrl.for_request("interactive").steps == ()
    assert ctrl.for_request("normal").actions == ["fallback_model"]
    assert ctrl.for_request("batch").actions == ["fallback_model"]
    run(ctrl, clock, 10, queue_wait=2.0)
    assert ctrl.level == 3
    assert ctrl.for_request("interactive").actions == ["cache_only"]
    assert ctrl.for_request("normal").actions == ["fallback_model", "cache_only"]
    batch = ctrl.for_request("batch")
    assert batch.actions == ["fallback_model", "cap_max_tokens", "cache_only"]
    cap = batch.step("cap_max_tokens")
    assert cap is not None and cap.max_tokens == 64
    fallback = batch.step("fallback_model")
    assert fallback is not None and fallback.model == "small"
    assert ctrl.for_request("normal").step("cap_max_tokens") is None


def test_for_request_updates_the_level(clock: ManualClock) -> None:
    ctrl = controller(clock)
    ctrl.observe_queue_wait(2.0)
    assert ctrl.for_request("batch").steps == ()
    clock.now += 1.0
    ctrl.observe_queue_wait(2.0)
    clock.now += 4.0
    ctrl.observe_queue_wait(2.0)
    assert ctrl.for_request("batch").actions == ["fallback_model"]
    assert ctrl.level == 1


# ---- config ------------------------------------------------------------------------------------


def test_steps_without_a_trigger_are_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="queue_wait_p95_s or ttft_p95_s"):
        DegradationConfig(steps=[DegradationStep(action="cache_only")])


def test_no_steps_need_no_trigger() -> None:
    assert DegradationConfig().steps == []


@pytest.mark.parametrize(
    ("action", "needed"), [("fallback_model", "model"), ("cap_max_tokens", "max_tokens")]
)
def test_a_step_needs_its_setting(action: str, needed: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=needed):
        DegradationStep(action=action)  # type: ignore[arg-type]


def test_config_bounds() -> None:
    with pytest.raises(pydantic.ValidationError):
        DegradationConfig(queue_wait_p95_s=1.0, recover_ratio=1.0)
    with pytest.raises(pydantic.ValidationError):
        DegradationConfig(ttft_p95_s=0.0)
    with pytest.raises(pydantic.ValidationError):
        DegradationStep(action="cap_max_tokens", max_tokens=0)
