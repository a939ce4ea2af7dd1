import sys

from ._start import main

sys.exit(main())
