"""Entry point: ``python -m benchmarks [--quick] [--only SECTION] [--json PATH]``."""

from .harness import main

raise SystemExit(main())
