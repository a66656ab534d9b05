"""`python -m mqgate.pipeline run <config.toml> ...` (the same as `mqgate pipeline run ...`)."""

from mqgate.cli.pipeline import main

raise SystemExit(main())
