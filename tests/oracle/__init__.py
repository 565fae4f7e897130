"""The read-series oracle (see docs/oracle.md). Nothing here is imported by production code."""
