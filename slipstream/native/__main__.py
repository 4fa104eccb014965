"""`python -m slipstream.native`: build the native kernels ahead of the first training run."""

from slipstream.native import main

raise SystemExit(main())
