"""Dagster-aware operator helpers behind the ``storyboard`` CLI (``pipeline_defs.cli``)."""
