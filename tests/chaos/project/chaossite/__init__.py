"""The chaos suite's Django project."""
