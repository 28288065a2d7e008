"""`python -m uploader`: see uploader/cli.py."""

import sys

from uploader.cli import main

if __name__ == "__main__":
    sys.exit(main())
