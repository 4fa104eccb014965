"""One module per `slipstream` command group; each exposes `register(subparsers)`."""
