"""The chaos project's only app: one task, its run records and a client."""
