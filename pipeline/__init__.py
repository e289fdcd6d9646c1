"""evq's data pipeline on Spark: the ``evq`` data source and the stats, audit and archive
jobs over the event log (see README.md here). Modules are imported one by one: Spark loads
only when a job runs."""

__all__: list[str] = []
