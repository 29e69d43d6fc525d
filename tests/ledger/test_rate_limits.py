"""The shared rate limit's ledger side (docs/DESIGN.md#rate-limit) on both ledgers: slots
reserved from one row, spaced by the limit whoever reserves them, a 429's pause honoured by
every reservation, tokens settled, and the waits ``status`` reads."""

import threading

import pytest

from pipeline_defs.resume.partition import StepKey
from resources.ledger.gcra import Limits, RateState, pause, reserve, settle
from resources.ledger.store import LedgerStore

ENDPOINT, MODEL = "http://127.0.0.1:1/v1", "gpt-test"
RPM = Limits(requests_per_minute=30)
INTERVAL = RPM.request_interval


def test_gcra_spaces_grants_with_no_burst() -> None:
    state, waits = RateState(), []
    for _ in range(4):
        state, wait = reserve(state, RPM, 100.0, 0)
        waits.append(wait)
    assert waits == pytest.approx([0, INTERVAL, 2 * INTERVAL, 3 * INTERVAL])
    # Any 60 s holds at most the limit: 30 grants span 29 intervals, more than 58 s.
    assert 29 * INTERVAL > 58 and 30 * INTERVAL > 60


def test_gcra_pause_and_tokens() -> None:
    tokens = Limits(tokens_per_minute=6000)
    state, wait = reserve(RateState(), tokens, 0.0, 1000)
    assert wait == 0
    state, wait = reserve(state, tokens, 0.0, 1000)
    assert wait == pytest.approx(tokens.token_seconds(1000))
    settled = settle(state, tokens, 1000, 100)
    assert settled.token_at == pytest.approx(state.token_at - tokens.token_seconds(900))
    paused = pause(RateState(), 10.0, 3.0)
    _, wait = reserve(paused, Limits(), 10.0, 0)
    assert wait == pytest.approx(3.0)


def test_reservations_share_one_row(store: LedgerStore) -> None:
    rates = store.rate_limits
    waits = [rates.reserve(ENDPOINT, MODEL, RPM) for _ in range(3)]
    assert waits[0] == pytest.approx(0, abs=0.05)
    assert waits[1] == pytest.approx(INTERVAL, abs=0.5)
    assert waits[2] == pytest.approx(2 * INTERVAL, abs=0.5)
    # Another model of the endpoint, and another store on the same ledger's other row.
    assert rates.reserve(ENDPOINT, "other-model", RPM) == pytest.approx(0, abs=0.05)
    other = LedgerStore(store.url).rate_limits
    assert other.reserve(ENDPOINT, MODEL, RPM) == pytest.approx(3 * INTERVAL, abs=1.0)


def test_racing_reservations_take_distinct_slots(store: LedgerStore) -> None:
    got: list[float] = []
    lock = threading.Lock()

    def reserve_some() -> None:
        rates = LedgerStore(store.url).rate_limits
        for _ in range(5):
            wait = rates.reserve(ENDPOINT, MODEL, Limits(requests_per_minute=600))
            with lock:
                got.append(wait)

    threads = [threading.Thread(target=reserve_some) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 20 slots 0.1 s apart: the last is ~1.9 s out (reserved within a second or so).
    assert len(got) == 20
    assert max(got) > 19 * Limits(requests_per_minute=600).request_interval - 1.0


def test_a_pause_holds_every_reservation(store: LedgerStore) -> None:
    rates = store.rate_limits
    assert rates.pause(ENDPOINT, MODEL, 3.0) == pytest.approx(3.0, abs=0.1)
    assert rates.paused_for(ENDPOINT, MODEL) == pytest.approx(3.0, abs=0.2)
    assert rates.paused_for(ENDPOINT, "other-model") == 0
    assert rates.reserve(ENDPOINT, MODEL, Limits()) == pytest.approx(3.0, abs=0.2)
    assert rates.reserve(ENDPOINT, MODEL, RPM) == pytest.approx(3.0, abs=0.2)


def test_waits_noted_and_cleared(store: LedgerStore) -> None:
    rates = store.rate_limits
    key = StepKey("p1", "ep01", "logline")
    rates.note_wait(key, "run-1", ENDPOINT, MODEL, "2030-01-01T00:00:12.000000Z")
    rates.note_wait(key, "run-1", ENDPOINT, MODEL, "2030-01-01T00:00:14.000000Z")
    waits = rates.waits()
    assert list(waits) == [key] and waits[key].until.startswith("2030-01-01T00:00:14")
    rates.clear_wait(key, "run-other")  # another run's clear leaves it
    assert key in rates.waits()
    rates.clear_wait(key, "run-1")
    assert rates.waits() == {}
