"""The development kit: brokers to run locally (the embedded one and Apache Kafka), certificates,
and their launchers. Production applications never import it (import-linter)."""
