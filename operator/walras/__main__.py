"""``python -m walras`` runs the command line."""

import sys

from walras.cli import main

sys.exit(main())
