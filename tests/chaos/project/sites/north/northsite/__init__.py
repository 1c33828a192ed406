"""North: one of two Django projects sharing one Redis (tests/chaos/test_shared_redis.py)."""
