"""`python -m lab` and `torchrun ... -m lab train`."""

import sys

from lab.cli import main

if __name__ == "__main__":
    sys.exit(main())
