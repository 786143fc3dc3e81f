"""What Airflow's providers manager lists for Shoal (entry point ``apache_airflow_provider`` in pyproject.toml).

The runtime schema is ``airflow/provider_info.schema.json``. ``package-name`` must equal the distribution name
(``[project] name`` in pyproject.toml): Airflow refuses a provider whose two names differ. Deliberately absent:
``connection-types`` (Shoal uses the apache-kafka provider's ``kafka`` connection and must not register it a second
time) and ``plugins`` (the UI page is registered through the ``airflow.plugins`` entry point; listing it here too
would load it twice).
"""

from __future__ import annotations

DISTRIBUTION = "shoal"
INTEGRATION = "Shoal"


def get_provider_info() -> dict:
    def modules(*names: str) -> list[dict]:
        return [{"integration-name": INTEGRATION, "python-modules": [f"shoal_airflow.{n}" for n in names]}]

    return {
        "package-name": DISTRIBUTION,
        "name": "Shoal",
        "description": "Mirror and back-fill Apache Kafka data between clusters by copying raw record batches: "
                       "back-fill, catch-up/handoff, DR rehearsal and retention-guard DAGs on Kafka connections.",
        "integrations": [{"integration-name": INTEGRATION, "tags": ["apache"],
                          "external-doc-url": "https://kafka.apache.org/"}],
        "hooks": modules("hooks"),
        "operators": modules("operators"),
        "sensors": modules("sensors"),
        "triggers": modules("triggers"),
    }
