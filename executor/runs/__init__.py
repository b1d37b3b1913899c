"""The runs room."""
