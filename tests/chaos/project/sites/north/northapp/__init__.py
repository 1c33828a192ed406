"""North's app: its one task."""
