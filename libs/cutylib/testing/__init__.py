"""Test harness shared by every context: Postgres, service processes, ids."""
