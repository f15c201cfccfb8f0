"""Entry point: ``python -m benchmarks [--quick] [--only SECTION] [--json PATH]``."""

from .run import main

raise SystemExit(main())
