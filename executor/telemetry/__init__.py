"""The telemetry room."""
