"""The log's record schemas (Avro ``*.avsc``; the read wire's JSON Schema) and the records' encoding.

Its modules, one concern each:

- ``codec``: Avro encoding of the log's records, with the writer schema named in every record;
- ``registry``: a schema registry client (Confluent's REST API) and the Confluent wire format's schema ids;
- ``exceptions``: errors of the records' encoding.
"""
