"""What the project's own code does: `python -m shop.client enqueue` / `... results ID ...`."""

import json
import sys

import django

django.setup()

from shop import tasks  # noqa: E402

if sys.argv[1] == "enqueue":
    results = [tasks.total.enqueue([1, 2, 3.5]), tasks.attempt.enqueue(), tasks.broken.enqueue()]
    print(json.dumps([result.id for result in results]))
else:
    out = []
    for task, result_id in zip((tasks.total, tasks.attempt, tasks.broken), sys.argv[2:], strict=True):
        result = task.get_result(result_id)
        out.append(
            {
                "status": str(result.status),
                "value": result.return_value if result.status == "SUCCESSFUL" else None,
                "errors": [error.exception_class_path for error in result.errors],
                "attempts": result.attempts,
                "finished": result.finished_at is not None,
            }
        )
    print(json.dumps(out))
