import sys

from lscore._cli import main

sys.exit(main())
