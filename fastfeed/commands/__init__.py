"""One module per `fastfeed` sub-command; each exposes `configure(parser)` and `run(args) -> int`."""
