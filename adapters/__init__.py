"""tidelog.adapters: integrations with other systems (Spark)."""
