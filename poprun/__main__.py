import sys

from poprun.cli import main

sys.exit(main())
