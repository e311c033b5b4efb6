"""``python -m field`` is the ``field`` command."""

import sys

from .cli.main import main

sys.exit(main())
