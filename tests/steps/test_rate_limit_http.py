"""The shared rate limit at the HTTP provider (docs/DESIGN.md#rate-limit), on both ledgers:
callers in several threads, each with its own ledger store as separate processes would have,
against the local OpenAI-compatible server. Grants are spaced by the limit whoever asks; a
429 with ``Retry-After`` pauses every caller (nobody hammers the endpoint meanwhile); an
owner fenced out while it waits sends nothing."""

import threading
import time
from collections.abc import Iterator

import pytest
from openai_server import CHAT, FakeOpenAI, Reply, chat_body, serving

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.steps.rate_wait import LedgerThrottle
from resources.ledger.gcra import Limits
from resources.ledger.store import LedgerStore
from resources.providers import OpenAITextModel, TextCall
from resources.providers.throttle import retry_after_seconds, throttled

KEY_ENV = "SB_RATE_TEST_KEY"
MODEL = "gpt-rate-test"


@pytest.fixture
def chat_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    monkeypatch.setenv(KEY_ENV, "sk-rate-test")
    with serving() as fake:
        fake.script(CHAT, Reply(body=chat_body('{"ok": true}', model=MODEL)))
        yield fake


def _caller(
    db_url: str, chat_server: FakeOpenAI, limits: Limits, calls: int, step: str
) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            ledger = LedgerStore(db_url)
            throttle = LedgerThrottle(ledger.rate_limits, StepKey("p1", "ep01", step), "r", limits)
            model = OpenAITextModel(base_url=chat_server.base_url, model=MODEL, api_key_env=KEY_ENV)
            for n in range(calls):
                with throttled(throttle):
                    model.complete(TextCall("logline", f"say {n}", {}))
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    return threading.Thread(target=run), errors


def _run_all(callers: list[tuple[threading.Thread, list[BaseException]]]) -> None:
    for thread, _ in callers:
        thread.start()
    for thread, _ in callers:
        thread.join(timeout=120)
    assert [e for _, errors in callers for e in errors] == []


def test_grants_are_spaced_by_the_limit_across_callers(
    db_url: str, chat_server: FakeOpenAI
) -> None:
    LedgerStore(db_url).migrate()
    limits = Limits(requests_per_minute=120)  # one call every 0.51 s
    _run_all([_caller(db_url, chat_server, limits, 4, f"s{n}") for n in range(3)])
    arrivals = sorted(seen.at for seen in chat_server.seen(CHAT))
    assert len(arrivals) == 12
    # Each grant one interval after the last, whoever asked; on a loaded machine a request
    # may reach the server late, so arrivals jitter by up to the slack (1.2 s).
    assert arrivals[-1] - arrivals[0] >= 11 * limits.request_interval - 1.2, arrivals


def test_a_429_pauses_every_caller(db_url: str, chat_server: FakeOpenAI) -> None:
    LedgerStore(db_url).migrate()
    ok = Reply(body=chat_body('{"ok": true}', model=MODEL))
    chat_server.script(
        CHAT, Reply(429, {"error": {"message": "slow down"}}, {"retry-after": "3"}), ok
    )
    first = _caller(db_url, chat_server, Limits(), 1, "first")
    first[0].start()  # meets the 429, pauses everyone, waits, asks again
    deadline = time.monotonic() + 30
    while not chat_server.seen(CHAT) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)  # the 429 is back and its pause recorded
    others = [_caller(db_url, chat_server, Limits(), 2, f"o{n}") for n in range(3)]
    _run_all(others)
    first[0].join(timeout=60)
    assert first[1] == []
    seen = chat_server.seen(CHAT)
    refused_at = seen[0].at
    assert len(seen) == 1 + 1 + 6
    # Nobody asked again, nor anew, before the Retry-After had passed.
    assert min(s.at for s in seen[1:]) >= refused_at + 2.9


def test_the_pause_holds_callers_that_start_during_it(db_url: str, chat_server: FakeOpenAI) -> None:
    ledger = LedgerStore(db_url)
    ledger.migrate()
    ledger.rate_limits.pause(chat_server.base_url, MODEL, 2.0)
    started = time.monotonic()
    _run_all([_caller(db_url, chat_server, Limits(), 1, f"s{n}") for n in range(3)])
    assert min(s.at for s in chat_server.seen(CHAT)) >= started + 1.8


def test_a_fenced_owner_sends_nothing_while_it_waits(db_url: str, chat_server: FakeOpenAI) -> None:
    ledger = LedgerStore(db_url)
    ledger.migrate()
    ledger.rate_limits.pause(chat_server.base_url, MODEL, 30.0)
    slices: list[float] = []

    def guard() -> None:
        if len(slices) >= 2:
            raise PipelineError(ErrorCode.STEP_OWNERSHIP_LOST, "lost")

    key = StepKey("p1", "ep01", "logline")
    throttle = LedgerThrottle(ledger.rate_limits, key, "r", Limits(), guard, sleep=slices.append)
    model = OpenAITextModel(base_url=chat_server.base_url, model=MODEL, api_key_env=KEY_ENV)
    with pytest.raises(PipelineError) as raised, throttled(throttle):
        model.complete(TextCall("logline", "say", {}))
    assert raised.value.code == ErrorCode.STEP_OWNERSHIP_LOST
    assert chat_server.seen(CHAT) == []
    assert ledger.rate_limits.waits() == {}  # the note of its wait went with it


def test_retry_after_is_read_in_every_form() -> None:
    assert retry_after_seconds({"retry-after-ms": "1500"}) == 1.5
    assert retry_after_seconds({"retry-after": "12"}) == 12
    date = "Wed, 21 Oct 2015 07:28:12 GMT"
    assert retry_after_seconds({"retry-after": date}, now=1445412482.0) == pytest.approx(10)
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None
