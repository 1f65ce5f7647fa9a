"""``python -m dessim``: the ``dessim`` command (:func:`dessim.cli.main.main`)."""

from __future__ import annotations

import sys

from dessim.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
