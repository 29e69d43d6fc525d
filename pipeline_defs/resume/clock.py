"""Timestamp text <-> datetime, shared by the judge and the ledger.

The ledger stores timestamps as ISO-8601 UTC text and never casts them in SQL, so every
reader parses them here: one tolerant parser (a bad value is a decision input, not a crash)
and one canonical formatter (so texts written by us compare equal byte for byte).
"""

from datetime import UTC, datetime, timedelta

# How far ahead of the judge's clock a ``started_at`` may lie and still be believed. Hosts'
# clocks drift apart (NTP, containers, a laptop resuming), so a lease written moments ago by
# a host whose clock runs a little fast is a live owner. Beyond this the text cannot be
# trusted: ``now - started_at`` stays negative, never reaches the running timeout, and the
# lease would look healthy forever, so it is treated like an unparseable one.
MAX_CLOCK_SKEW = timedelta(seconds=300)


def as_utc(dt: datetime) -> datetime:
    """Naive datetimes are taken as UTC; aware ones are converted to UTC."""
    if dt.tzinfo is None or dt.utcoffset() is None:
        return dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def parse_timestamp(text: str | None) -> datetime | None:
    """Parse ISO-8601 text (``Z``, ``+hh:mm`` or naive = UTC) to aware UTC; None if unusable.

    Never raises: a NULL, empty or garbage value must become a judged state (manual
    investigation), not an exception in the sensor.
    """
    try:
        if isinstance(text, datetime):  # a driver may hand back a datetime; accept it
            return as_utc(text)
        if not isinstance(text, str):
            return None
        stripped = text.strip()
        if not stripped:
            return None
        return as_utc(datetime.fromisoformat(stripped))
    except (ValueError, TypeError, OverflowError):
        return None


def format_timestamp(dt: datetime) -> str:
    """Canonical UTC text, always with microseconds and ``Z``: ``2026-11-30T13:07:15.123456Z``."""
    return as_utc(dt).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def beyond_clock_skew(moment: datetime, now: datetime) -> bool:
    """Whether ``moment`` lies further in the future than clock skew can explain."""
    return as_utc(moment) - as_utc(now) > MAX_CLOCK_SKEW
