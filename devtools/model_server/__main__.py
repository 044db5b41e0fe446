"""``python -m devtools.model_server``: serve the local model on loopback."""

from __future__ import annotations

import sys

from devtools.model_server.cli import main

sys.exit(main())
