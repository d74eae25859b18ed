"""``python -m aiocubie``: the command line (see :mod:`aiocubie._cli`).

Nothing here but the entry point; it must not import numba.cuda before the backend is chosen.
"""

from __future__ import annotations

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
