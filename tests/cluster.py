"""Fixture `redis_cluster`: a 3-master Redis Cluster on loopback ports (filled in by the cluster tests)."""
