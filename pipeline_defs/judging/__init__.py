"""Batch judgement, Dagster-free: every step of many partitions judged with the one judge.

The resume sensor (``sensors/``), ``storyboard status`` / ``decide`` and the benchmarks
share it: ``evaluation`` (``BatchJudge``), ``parallel`` (worker processes for cold scans)
and ``tick`` (incremental ticks: what changed since the cursor), whose phases are
``scan``, ``plan``, ``dispatch``, ``memo``, ``blocks`` and ``cursor``; ``registry`` keeps
one ticker per sensor.
"""
