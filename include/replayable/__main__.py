"""``python -m replayable``: the terminal view of the ledger (see :mod:`replayable.cli`)."""

import sys

from replayable.cli import main

if __name__ == "__main__":
    sys.exit(main())
