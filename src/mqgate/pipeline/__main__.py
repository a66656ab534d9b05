"""`python -m mqgate.pipeline run <config.toml> ...` (the same as `mqgate pipeline run ...`)."""

from mqgate.pipeline.cli import main

raise SystemExit(main())
