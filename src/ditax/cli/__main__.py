"""``python -m ditax.cli ...``: the ``ditax`` command without the installed script."""

import sys

from ditax.cli import main

sys.exit(main())
