"""Pipeline-wide commands over both services: status and verify."""
