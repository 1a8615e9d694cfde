"""``python -m leadscale``: the same as the ``leadscale`` command."""

import sys

from leadscale.cli import main

sys.exit(main())
