"""``python -m pipeline_defs.cli``: the ``storyboard`` command."""

from pipeline_defs.cli import main

main(prog_name="storyboard")
