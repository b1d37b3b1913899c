"""The server room."""
