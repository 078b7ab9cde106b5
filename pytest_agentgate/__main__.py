"""``python -m pytest_agentgate`` runs the ``agentgate`` command."""

import sys

from .cli import main

sys.exit(main())
