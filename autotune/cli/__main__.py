"""`python -m autotune.cli`: the command line."""

import sys

from autotune.cli.main import main

sys.exit(main())
