"""``python -m diffill`` = the ``diffill`` command (:mod:`diffill.cli`)."""

import sys

from .cli import main

sys.exit(main())
