"""The Django app of bench/cluster.py: its settings and the task its workers drain."""
