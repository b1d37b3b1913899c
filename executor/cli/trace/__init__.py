"""The cli/trace room."""
