"""Benchmarks of django-rtq (an installed app, so that `bench.tasks` is autodiscovered)."""
