"""Release B of the deploy scenario's app (tests/chaos/test_deploys.py): the one deployed over A.

Against release A: `d` is a new task type; `c` takes a new argument `j` (with a default); the
receipt moved to `deployapp.receipts.send_receipt`, keeping A's name `deployapp.tasks.receipt`
as an alias."""
