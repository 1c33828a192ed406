"""The admin's live views over Redis: dashboard, task lists, task page and actions."""
