"""``python -m field`` is the ``field`` command."""

import sys

from .cli import main

sys.exit(main())
