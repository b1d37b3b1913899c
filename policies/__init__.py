"""The policy files shipped with execgate (package data; see default.yaml)."""
