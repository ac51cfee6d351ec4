"""The metrics every run reports as ``final/<name>`` to TensorBoard's HParams dashboard.

Its own module, without TensorFlow: the sweep callbacks read it in the launcher's process,
and the run's summaries in the job. A task writes those it measures (the single task has no
success rate, the dataset task no single loss; only the dataset task on a table has
``feature_share``, the moved feature's share of the held-out |relevance|, and on texts
``token_share``, the moved word's: what a fairwashing sweep compares). ``steps`` is the updates the run did: TensorBoard keeps a run's first HParams
row, so the row of a run extended by a resume still shows its first ``trainer.steps``.
"""

FINAL_METRICS = (
    "objective", "cosine", "ssim", "pearson", "spearman", "loss", "student_accuracy", "success_rate", "agreement",
    "feature_share", "token_share", "steps",
)
