"""The provider's size limits, which the Files and Batch API enforce and the faults may lower.

Both :mod:`~devtools.model_server.batches` (which enforces them) and
:mod:`~devtools.model_server.faults` (whose ``batch_max_*`` and ``files_max_total_bytes``
keys lower them) read them from here.
"""

from __future__ import annotations

# A /v1 request body, and an upload's: the file and the rest of the form around it.
MAX_BODY_BYTES = 16 * 1024 * 1024
FILE_MAX_BYTES = 200 * 1024 * 1024
UPLOAD_MAX_BODY_BYTES = FILE_MAX_BYTES + 1024 * 1024
FILES_MAX_TOTAL_BYTES = 512 * 1024 * 1024
# OpenAI's: the most lines of a batch, and the most embedding inputs over all of them.
BATCH_MAX_REQUESTS = 50_000
BATCH_MAX_INPUTS = 50_000
