"""The producer side: what agents use to publish wire events (``producer``), the
realistic corpus the demo, tests and benchmarks share (``corpus``) and the
``stepstream demo`` command (``demo``). Import the module you need: this package
imports nothing, so using the pure corpus never pulls in a Kafka client."""
