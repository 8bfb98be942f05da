"""`python -m mindvl.cli ...`, the same as `mindvl ...`."""
import sys

from mindvl.cli.main import main

sys.exit(main())
