"""The ``field`` command and what only it uses (its log lines and their redaction)."""
