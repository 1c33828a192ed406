"""The chaos suite: real `rtq_worker` processes of a project of its own, under faults (issue 10)."""
