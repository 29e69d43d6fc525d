"""The code location of ``benchmarks/sensor_convergence.py``: the shipped wiring on the
benchmark's ten trivial stand-in steps (``benchmarks/sensor_tick.py`` ``STEPS``).

Built by ``build_defs`` exactly as ``pipeline_defs.defs`` is (the production sensor
interval and tick budget); the home and ledger come from ``PIPELINE_HOME`` /
``PIPELINE_DB_URL`` as in a deployment.
"""

from sensor_tick import STEPS  # the working directory of the workspace: benchmarks/

from pipeline_defs.definitions import build_defs

defs = build_defs(STEPS)
