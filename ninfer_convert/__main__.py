"""``python -m ninfer_convert`` runs the ``ninfer`` command line."""

import sys

from .cli import main

sys.exit(main())
