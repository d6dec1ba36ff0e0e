"""`python -m sparkfleet`: the same as the `sparkfleet` command."""

import sys

from sparkfleet.cli import main

sys.exit(main())
