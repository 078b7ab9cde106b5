"""``python -m pytest_agentgate`` runs the ``agentgate`` command."""

import sys

from .cli.main import main

sys.exit(main())
