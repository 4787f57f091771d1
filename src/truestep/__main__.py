"""`python -m truestep ...` (what torchrun launches with `-m truestep`)."""

import sys

from truestep.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
