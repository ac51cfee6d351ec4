"""One multi-worker job on Ray Train: heatinv's dataset task on N Ray workers.

    pip install "ray[train]"
    python scripts/multi_worker/ray_train.py outputs/ray_two_workers debug=smoke task=dataset target=pattern

Ray Train's ``TensorflowTrainer`` starts the workers (here on a local Ray instance; on a
cluster, ``ray.init(address="auto")``) and sets ``TF_CONFIG`` on each, as Kubernetes' TFJob
does; each worker composes heatinv's config from the same overrides and runs the job with
``trainer.strategy=multi_worker``. Worker 0 is the chief and writes the run into the folder
given (on a file system every worker sees); ``--workers`` sets N (default 2).
"""

from __future__ import annotations

import argparse
import os


def job(config: dict) -> None:
    """One worker's part: the config composed as the command line's, the strategy made before
    anything starts TensorFlow's devices, then heatinv's job."""
    from hydra import compose, initialize_config_module

    from heatinv.config import register

    register()
    overrides = ["trainer.strategy=multi_worker", *config["overrides"]]
    overrides += [f"paths.output_dir={config['run_dir']}", f"paths.root={config['run_dir']}", f"paths.cache_dir={config['cache_dir']}"]
    with initialize_config_module(config_module="heatinv.configs", version_base="1.3"):
        cfg = compose("train", overrides=overrides)

    from heatinv.cluster import multi_worker_strategy

    multi_worker_strategy(cfg.trainer.collective_timeout)
    from heatinv.train import run

    run(cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="the run directory the chief writes")
    parser.add_argument("overrides", nargs="*", help="heatinv's overrides, as on its command line")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache-dir", default=None, help="paths.cache_dir (default: <run_dir>/../cache)")
    args = parser.parse_args()
    run_dir = os.path.abspath(args.run_dir)
    cache_dir = os.path.abspath(args.cache_dir or os.path.join(run_dir, os.pardir, "cache"))

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=args.workers, include_dashboard=False)
    trainer = TensorflowTrainer(
        train_loop_per_worker=job,
        train_loop_config={"overrides": args.overrides, "run_dir": run_dir, "cache_dir": cache_dir},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
        run_config=RunConfig(name="heatinv", storage_path=os.path.join(run_dir, os.pardir, "ray_results")),
    )
    trainer.fit()
    print(f"heatinv: the chief's run is in {run_dir}")


if __name__ == "__main__":
    main()
