"""The process-wide tickers: one per sensor over one set of stores and steps.

The sensor's code server is long-lived; a ticker keeps its memos between ticks, so the
sensor asks here for the same ticker every tick.
"""

import threading
from collections.abc import Sequence

from pipeline_defs.judging.cursor import scope_of
from pipeline_defs.judging.stores import ReadStores
from pipeline_defs.judging.tick import ResumeTicker
from pipeline_defs.judging.tick_result import TickConfig
from pipeline_defs.steps.graph import order_steps
from pipeline_defs.steps.spec import Step

_TICKERS: dict[tuple[str, str], ResumeTicker] = {}
_TICKERS_LOCK = threading.Lock()
_MAX_TICKERS = 16


def ticker_for(
    name: str, steps: Sequence[Step], stores: ReadStores, config: TickConfig
) -> ResumeTicker:
    """The process-wide ticker of one sensor over one set of stores and steps."""
    key = (name, scope_of(order_steps(steps), stores))
    with _TICKERS_LOCK:
        ticker = _TICKERS.get(key)
        if ticker is None or ticker.config != config or ticker.stores != stores:
            if ticker is not None:
                ticker.close()
            if len(_TICKERS) >= _MAX_TICKERS:
                _TICKERS.pop(next(iter(_TICKERS))).close()
            ticker = _TICKERS[key] = ResumeTicker(steps, stores, config)
        return ticker


def forget_tickers() -> None:
    """Drop every ticker's memory (the next tick of each sensor judges everything)."""
    with _TICKERS_LOCK:
        for ticker in _TICKERS.values():
            ticker.close()
        _TICKERS.clear()
