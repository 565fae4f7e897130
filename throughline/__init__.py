"""throughline: completed agent turns on a Kafka log, projected into DuckDB, read by an Observer."""
