"""Template tags and filters of django-rtq's admin pages."""
