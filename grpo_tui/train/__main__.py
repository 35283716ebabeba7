"""`python -m grpo_tui.train --run-dir RUN`: the trainer's entry under `accelerate launch`."""

import sys

from grpo_tui.train.entry import main

sys.exit(main(hard_exit=True))
