"""`python -m slipstream.samples.native`: build the native kernels ahead of the first training run."""

from slipstream.samples.native import main

raise SystemExit(main())
