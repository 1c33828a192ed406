"""Models of django-rtq. Live task state is in Redis, not here."""
