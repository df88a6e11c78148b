"""`python -m memorymark`: see memorymark/cli.py."""

import sys

from memorymark.cli import main

sys.exit(main())
