"""The composition root: the configuration ``field serve`` reads once, and the
uvicorn server it runs."""
