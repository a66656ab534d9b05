"""Per-project queue state over time: the sampler (hot-path observations rolled up into
interval rows), the SQL history of those rows and the recorder that connects them.

Import the submodules (`mqgate.queuestate.sampler`, `.history`, `.recorder`); this package
itself imports nothing, so the pure row types load without SQLAlchemy.
"""
