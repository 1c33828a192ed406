"""The chaos project's only app: two tasks, their run records, an order model and its views,
and a client."""
