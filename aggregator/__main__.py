"""`python -m aggregator` runs the CLI."""

import sys

from aggregator.cli import main

sys.exit(main())
