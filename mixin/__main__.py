"""`python -m mixin`: see mixin.cli."""

import sys

from mixin.cli import main

sys.exit(main())
