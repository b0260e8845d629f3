"""``python -m pipeline verify``: prove that the lake equals the source (docs/verify.md)."""
