"""The Dagster wiring of the run protocol: the step assets (``assets.py``: partitions, the
``resume_integrity`` check, launch tags, the run protocol inside each asset) and the
checkpoint IO manager (``io_manager.py``). The only modules of ``pipeline_defs`` below the
entry points and the sensors that import ``dagster``: the steps, the judge and the batch
judgement stay Dagster-free (an import-linter contract holds them to it).
"""
