"""The lines a job writes to its log (``<job dir>/train.log``) that a sweep's summary reads back.

Its own module, without TensorFlow: the sweep callbacks (:mod:`heatinv.callbacks`) read the
logs in the launcher's process; the job's modules write them.
"""

FAILED_MARK = "heatinv job failed: "
"""Starts the record of a job's exception (its type and message; the traceback follows)."""

DONE_MARK = "heatinv: results in "
"""Starts a run's last line when its results are written (or kept): a failure before it was an earlier attempt's."""

UNREAD_MARK = "; this job runs without it."
"""Ends a job's warning ``heatinv: <key>=<value> is read only with ...``: a key the sweep set that its choices ignore."""
