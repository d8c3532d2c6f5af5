import sys

from lpfail.cli import main

sys.exit(main())
