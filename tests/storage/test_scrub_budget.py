"""The scrub's budget: every episode once per period, spread evenly over the ticks."""

from collections import Counter

from pipeline_defs.judging.scrub import Scrub
from pipeline_defs.resume.partition import Episode

EPISODES = [Episode("p", f"e{i:03d}") for i in range(100)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_each_episode_is_scrubbed_once_per_period_a_share_per_tick() -> None:
    """100 episodes, a 3600 s period, a tick every 30 s: 0.83 episodes per tick, each
    episode exactly once in the 120 ticks of one period, none twice before all once."""
    clock = Clock()
    scrub = Scrub(clock=clock)
    assert scrub.due(EPISODES, 3600) == []  # the first tick has no elapsed time to spend
    seen: Counter[Episode] = Counter()
    per_tick: list[int] = []
    for _ in range(120):
        clock.now += 30
        chosen = scrub.due(EPISODES, 3600)
        per_tick.append(len(chosen))
        seen.update(chosen)
    assert set(seen) == set(EPISODES) and set(seen.values()) == {1}
    assert set(per_tick) == {0, 1}  # spread, not bunched: the request rate is known


def test_a_long_pause_scrubs_at_most_every_episode_once() -> None:
    clock = Clock()
    scrub = Scrub(clock=clock)
    scrub.due(EPISODES, 60)
    clock.now += 10 * 3600  # the sensor was stopped for hours
    chosen = scrub.due(EPISODES, 60)
    assert sorted(chosen) == sorted(EPISODES)
    clock.now += 6  # a tenth of a period later: a tenth of the episodes, where the round left off
    assert len(scrub.due(EPISODES, 60)) == 10


def test_a_changed_episode_list_keeps_the_round_going() -> None:
    clock = Clock()
    scrub = Scrub(clock=clock)
    scrub.due(EPISODES, 100)
    clock.now += 50
    first = scrub.due(EPISODES, 100)
    assert first == EPISODES[:50]
    clock.now += 50
    assert scrub.due(EPISODES[:60], 100) == EPISODES[50:60] + EPISODES[:20]
