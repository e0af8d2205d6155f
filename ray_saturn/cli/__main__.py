"""``python -m ray_saturn.cli ...``: the ``ray-saturn`` command (e.g. where no console script is installed)."""

import sys

from ray_saturn.cli import main

sys.exit(main())
