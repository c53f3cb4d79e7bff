import sys

from attnx.cli import main

sys.exit(main())
