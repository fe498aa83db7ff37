"""`python -m andrea ...`: the `andrea` command (how launched ranks start it)."""

import sys

from andrea.cli import main

sys.exit(main())
