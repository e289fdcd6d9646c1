"""``python -m evq``: the ``evq`` command (:func:`evq.cli.console.main`)."""

import sys

from evq.cli.console import main

sys.exit(main())
