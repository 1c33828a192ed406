"""Admin registrations of django-rtq (the live-state views come with the admin issue)."""
