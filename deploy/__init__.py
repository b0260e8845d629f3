"""Deployment assets and the local service launcher (``python -m deploy.local``)."""
