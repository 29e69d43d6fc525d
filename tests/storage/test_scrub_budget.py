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


def test_a_restarted_process_goes_on_with_the_round_from_the_cursor() -> None:
    """A code server restarted more often than the period started the round again each
    time, so the episodes at its end were never scrubbed. The round's state rides in the
    sensor's cursor: the next process goes on where the last one stopped."""
    import json

    from pipeline_defs.judging.cursor import CursorState, cursor_extra, with_cursor_extra

    clock = Clock()
    first = Scrub(clock=clock)
    first.due(EPISODES, 100)
    clock.now += 50
    assert first.due(EPISODES, 100) == EPISODES[:50]
    tick_cursor = CursorState(parts="abc", pending=2).encode()
    cursor = with_cursor_extra(tick_cursor, "scrub", first.state())
    assert CursorState.decode(cursor) == CursorState.decode(tick_cursor)  # the tick's own
    saved = json.loads(json.dumps(cursor_extra(cursor, "scrub")))

    restarted = Scrub(clock=clock)  # a new process: nothing in memory
    restarted.resume(saved)
    clock.now += 50
    assert restarted.due(EPISODES, 100) == EPISODES[50:]
    clock.now += 10
    assert restarted.due(EPISODES, 100) == EPISODES[:10]  # and round again
    # A process that has started its own round keeps it (a cursor is older than memory).
    first.resume({"next": EPISODES[90].partition_key, "at": 0.0, "carry": 0.0})
    clock.now += 10  # 70 s since its last share: 70 episodes from where it stopped
    assert first.due(EPISODES, 100) == EPISODES[50:] + EPISODES[:20]
