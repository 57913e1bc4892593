"""The code pool: digital codes sold exactly once (docs/codepool.md)."""
