"""The pure core: values and rules with no Kafka and no DuckDB, and the ports to the edges.

Its modules, one concern each:

- ``turn``: a completed turn as it travels on the log, and its validation;
- ``identity``: project and source identity, canonical forms and the hashes that stand for them;
- ``chain``: content and chain digests of completed turns;
- ``fold``: how one turn record changes its source's chain; ``chain_delta``: what a run of appends does;
- ``repair``: a repair of a broken source as it travels on the log, and what applying it decides;
- ``cursor``: cursors, opaque versioned names of a prefix of one source's chain;
- ``page_range``: which turns one page of a read series holds;
- ``page_token``: page tokens, opaque and bound to one read series;
- ``encoding``: opaque strings (cursors, page tokens) and zig-zag varints;
- ``layers``: turns folded but not committed yet, as a read sees them above the committed projection;
- ``inflight``: records fetched but not applied yet, the proof behind a wait scoped to one project;
- ``key_filter``: ``KeyFilter``, which keys a set may hold (a Bloom filter);
- ``partitioning``: which partition holds a project;
- ``assignment``: which members of a ``serve --group`` hold which partitions;
- ``owner_map``: what the members of a ``serve --group`` tell each other, as values;
- ``seconds``: the one rule for a number of seconds a user gives (finite and >= 0);
- ``ports``: the ports between the core and the edges; ``memory``: their in-memory adapters, for tests;
- ``exceptions``: the core's errors.
"""
