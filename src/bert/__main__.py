"""`python -m bert ...` is the same as `bert ...`."""

import sys

from bert.cli import main

sys.exit(main())
