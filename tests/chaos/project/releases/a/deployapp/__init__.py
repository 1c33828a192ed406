"""Release A of the deploy scenario's app (tests/chaos/test_deploys.py): the one running before."""
