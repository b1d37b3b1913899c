"""The security corpus (issue 13): hostile input, path races, privilege and scope checks."""
