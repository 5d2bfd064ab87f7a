"""Running service calls at the same instant on separate threads and database connections (race tests)."""

import threading

from django.db import connection


def together(*calls):
    """Run each ``(function, kwargs)`` on its own thread and connection, released at once; ``[(result, error)]``."""
    barrier = threading.Barrier(len(calls))
    outcomes = [None] * len(calls)

    def body(index, function, kwargs):
        try:
            barrier.wait(10)
            outcomes[index] = (function(**kwargs), None)
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            outcomes[index] = (None, exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i, f, kw), daemon=True) for i, (f, kw) in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcomes
