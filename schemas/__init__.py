"""Value types shared by the capture and apply services."""
