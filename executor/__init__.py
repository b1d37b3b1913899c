"""execgate daemon."""
