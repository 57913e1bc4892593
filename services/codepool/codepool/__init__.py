"""The code pool: digital codes sold exactly once (issue 3; docs/codepool.md)."""
