"""South's app: its one task."""
