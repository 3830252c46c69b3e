"""The development kit: brokers to run locally (the embedded one and Apache Kafka, the TLS proxy in front of
the embedded one), certificates, their launchers, the tests' reference consumer (`consumer`), and the
synthetic workload generator behind replay measurements and benchmarks (`workload`). The simulator
(periscope.sim) is the rest of the kit. Production applications and the library never import it
(import-linter).
"""
