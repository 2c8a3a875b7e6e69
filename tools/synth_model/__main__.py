"""`python -m tools.synth_model`: the same as `llmb-synth-model`."""

import sys

from tools.synth_model.cli import main

sys.exit(main())
