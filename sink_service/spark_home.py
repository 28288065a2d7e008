"""`python -m sink_service.spark_home`: the documented command, kept at its name.

The code is sink_service/startup/class_archive.py."""

import sys

from sink_service.startup.class_archive import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
