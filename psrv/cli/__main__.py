"""`python -m psrv.cli`: the `psrv` command."""
import sys

from psrv.cli.main import main

sys.exit(main())
