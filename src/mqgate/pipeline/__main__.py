"""`python -m mqgate.pipeline run <config.toml> ...` (the same as `mqgate pipeline run ...`)."""

from mqgate.pipeline.command import main

raise SystemExit(main())
