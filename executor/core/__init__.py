"""The core room."""
