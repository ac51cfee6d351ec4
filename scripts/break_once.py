"""Break one documented behaviour at a time and check that a test notices.

Each mutation replaces one line of the code or a config in this checkout, runs the tests that
guard that behaviour, and puts the file back. A mutation whose tests still pass names a documented
statement no test checks. Run from the repository root with the package installed editable:

    python scripts/break_once.py            # every mutation
    python scripts/break_once.py swap       # those whose name contains "swap"
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

MUTATIONS = [
    ("data=mnist: uint8 scaled by 1/254", "heatinv/data/arrays.py",
     "(x.astype(np.float32) / 255.0)[..., None]", "(x.astype(np.float32) / 254.0)[..., None]",
     ["tests/test_readme_claims.py::test_data_mnist_reads_a_local_mnist_npz"]),
    ("target=digit7: the first held-out 1", "configs/target/digit7.yaml", "label: 7", "label: 1",
     ["tests/test_readme_claims.py::test_digit7_default_run_reaches_the_readmes_near_1_cosine"]),
    ("target=suppress: the top-k pixels never emptied", "heatinv/dataset_targets.py",
     "top = np.argsort(-flat, axis=1)[:, :top_k]", "top = np.argsort(-flat, axis=1)[:, :0]",
     ["tests/test_dataset_task.py::test_suppress_targets_empty_the_top_k_pixels_and_keep_the_total"]),
    ("target=pattern: the frame 1 px thinner at the top", "heatinv/targets.py",
     "mask[r(1) : r(3), c(1) : width - c(1)] =", "mask[r(1) : r(2), c(1) : width - c(1)] =",
     ["tests/test_targets.py"]),
    ("target=swap: the mean over the other classes", "heatinv/dataset_targets.py",
     "mean = source_maps[source_labels == like].mean(axis=0)", "mean = source_maps[source_labels != like].mean(axis=0)",
     ["tests/test_dataset_task.py::test_swap_targets_take_the_like_class_mean_from_the_given_source"]),
    ("task.early_stopping: the last epoch kept, not the best", "heatinv/dataset_task.py",
     "                weight.assign(best)", "                pass",
     ["tests/test_dataset_task.py::test_early_stopping_restores_the_best_admissible_validation_epoch"]),
    ("task.teacher=kl: without the T^2 factor", "heatinv/dataset_task.py",
     "return t * t * tf.reduce_sum(teacher", "return tf.reduce_sum(teacher",
     ["tests/test_dataset_task.py::test_kl_teacher_term_is_the_tempered_distillation_loss"]),
    ("precise BatchNorm: the moving statistics left as the fit left them", "heatinv/models.py",
     "                set_population_statistics(model, dataset.batches(\"train\", 32, fit))", "                pass",
     ["tests/test_precise_batch_norm.py"]),
]


def main(selected: list[str]) -> int:
    survivors = []
    for name, file, old, new, tests in MUTATIONS:
        if selected and not any(s in name for s in selected):
            continue
        path = ROOT / file
        text = path.read_text()
        if text.count(old) != 1:
            print(f"?? {name}: the line to break is not in {file} once (the code moved; update MUTATIONS)")
            survivors.append(name)
            continue
        path.write_text(text.replace(old, new))
        try:
            start = time.time()
            result = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
                cwd=ROOT, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
            )
        finally:
            path.write_text(text)
        caught = [line for line in result.stdout.splitlines() if line.startswith("FAILED")]
        verdict = "caught by " + caught[0][len("FAILED "):].split(" - ")[0] if caught else "NOT CAUGHT"
        print(f"{'ok' if caught else '!!'} {name}: {verdict} ({time.time() - start:.0f} s)", flush=True)
        if not caught:
            survivors.append(name)
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
