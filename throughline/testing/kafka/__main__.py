"""``python -m throughline.testing.kafka ...`` (see :mod:`throughline.testing.kafka.cli`)."""

import sys

from throughline.testing.kafka.cli import main

sys.exit(main())
