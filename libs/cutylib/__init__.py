"""Shared building blocks every Cuty service would otherwise copy.

Config, errors, the asyncpg pool and unit of work, the migration runner, the gRPC server
bootstrap and client channels, telemetry and logging, and the test harness.
"""
