"""``python -m tidelog.bench``: the same as ``tidelog bench``."""

import sys

from .harness import main

sys.exit(main())
