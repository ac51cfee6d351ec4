"""The metrics every run reports as ``final/<name>`` to TensorBoard's HParams dashboard.

Its own module, without TensorFlow: the sweep callbacks read it in the launcher's process,
and the run's summaries in the job.
"""

FINAL_METRICS = ("loss", "cosine", "ssim", "pearson", "spearman", "student_accuracy")
