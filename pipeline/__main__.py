"""``python -m pipeline JOB …`` and ``spark-submit pipeline/__main__.py JOB …``."""

import sys

from pipeline.main import main

if __name__ == "__main__":
    sys.exit(main())
