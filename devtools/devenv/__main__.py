"""``python -m devtools.devenv``: the commands behind ``make start``, ``run``, ``cluster``…"""

from __future__ import annotations

import sys

from devtools.devenv.cli import main

sys.exit(main())
