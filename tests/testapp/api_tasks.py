"""Task types of the API tests: some exposed to the REST API, one not."""

from django_rtq import task


@task(expose=True, retention=60)
def greet(name, count=1):
    """Say hello `count` times."""
    return " ".join([f"hello {name}"] * count)


@task(expose=True)
def positional_only(a, /, b=0):
    return a + b


@task(expose=True)
def keyword_only(*, subject):
    return subject


@task(expose=True)
def anything(*args, **kwargs):
    return [args, kwargs]


@task(expose=True, unique=True)
def once(key):
    return key


@task(expose=True, queue="low")
def low(value):
    return value


@task
def hidden(value):
    """Not exposed: the API must not enqueue it."""
    return value
