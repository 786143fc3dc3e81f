"""Outside the production graph — dev: the local Kafka sandbox (JVM brokers from Maven Central jars) and the
demo data and job of the README's quick start. Only the CLI and the tests import it.
"""
