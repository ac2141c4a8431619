import sys

from inferwatch.cli import main

sys.exit(main())
