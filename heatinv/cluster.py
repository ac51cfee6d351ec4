"""One job over several machines: the cluster this process belongs to, and its multi-worker strategy.

``trainer.strategy=multi_worker`` runs the dataset task on
``tf.distribute.MultiWorkerMirroredStrategy``. The cluster comes from where the job was
launched, never from a file of heatinv's own:

- ``TF_CONFIG`` (Kubernetes' TFJob, Ray Train's ``TensorflowTrainer``, or set by hand):
  ``{"cluster": {"worker": ["host0:port", "host1:port"]}, "task": {"type": "worker", "index": 0}}``;
- Slurm, under ``srun`` (``SLURM_PROCID`` and ``SLURM_STEP_NUM_TASKS`` of the job step): the
  workers are the step's tasks, on ports from ``SLURM_PORT_BASE``'s value (default 8888)
  (:func:`cluster_resolver`).

The chief (worker 0, or the task of type ``chief``) writes the run's files; every other
worker runs the same steps and writes into a temporary folder removed at the end
(:func:`heatinv.train.run`), as Keras's own multi-worker callbacks do.

Examples:
    >>> cluster = describe_cluster({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}'})
    >>> cluster.source, cluster.index, cluster.workers, cluster.chief
    ('TF_CONFIG', 1, 2, False)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

SLURM_PORT_BASE = 8888
STRATEGY_OVERRIDE = "trainer.strategy=multi_worker"


def asks_for_multi_worker(argv: list[str]) -> bool:
    """Whether the command line sets ``trainer.strategy=multi_worker``: TensorFlow must not start its
    devices before the strategy is made (it configures the collectives then, once per process).

    Examples:
        >>> asks_for_multi_worker(["-m", "heatinv.train", "trainer.strategy=multi_worker"]), asks_for_multi_worker(["debug=smoke"])
        (True, False)
    """
    return any(arg.lstrip("+~").strip("'\"") == STRATEGY_OVERRIDE for arg in argv)


class NoClusterError(ValueError):
    """``trainer.strategy=multi_worker`` in a process that belongs to no cluster."""


@dataclass(frozen=True)
class Cluster:
    """Where this process stands in its cluster.

    Attributes:
        source: ``"TF_CONFIG"`` or ``"Slurm"``: what described the cluster.
        index: this worker's index among the workers (the chief's task counts as worker 0).
        workers: how many processes take part.
        chief: whether this process writes the run's files.
    """

    source: str
    index: int
    workers: int
    chief: bool

    def __str__(self) -> str:
        role = "the chief" if self.chief else "not the chief: it writes nothing into the run directory"
        return f"worker {self.index} of {self.workers} ({self.source}; {role})"


class WorkerLost(RuntimeError):
    """A collective failed: another worker died, or did not answer within ``trainer.collective_timeout``."""

    def __init__(self, cluster: Cluster, run_dir: str, timeout: float, error: Exception):
        first = (getattr(error, "message", None) or str(error)).strip().splitlines()[0][:300]
        super().__init__(
            f"worker {cluster.index} of {cluster.workers} lost the others: a step's all-reduce failed "
            f"({type(error).__name__}: {first}), because a worker died or did not answer within "
            f"trainer.collective_timeout={timeout:g} s. The chief's newest checkpoint in {run_dir} is kept. Start the "
            "same command on every worker again with trainer.resume=true to continue from it."
        )


def describe_cluster(environ: Mapping[str, str] = os.environ) -> Cluster:
    """The cluster ``environ`` describes: ``TF_CONFIG`` first, else Slurm's job step.

    Raises:
        NoClusterError: neither is there (or ``TF_CONFIG`` names no cluster), with what to set.
    """
    if environ.get("TF_CONFIG"):
        try:
            config = json.loads(environ["TF_CONFIG"])
            cluster, task = config["cluster"], config["task"]
            kind, index = task["type"], int(task["index"])
        except (ValueError, KeyError, TypeError) as error:
            raise NoClusterError(
                f"TF_CONFIG={environ['TF_CONFIG']!r} is not a cluster: expected JSON with \"cluster\" (job name -> "
                f"list of host:port) and \"task\" ({{\"type\": \"worker\", \"index\": i}}); {type(error).__name__}: {error}."
            ) from None
        if kind not in ("chief", "worker") or kind not in cluster:
            raise NoClusterError(
                f"TF_CONFIG's task is {task!r}, which is not among its cluster's jobs {sorted(cluster)} of kind "
                "chief or worker. Give each process the same cluster and its own task: {\"type\": \"worker\", \"index\": i}."
            )
        chiefs = len(cluster.get("chief", []))
        workers = chiefs + len(cluster.get("worker", []))
        rank = index if kind == "chief" else index + chiefs
        chief = kind == "chief" or (not chiefs and index == 0)
        return Cluster("TF_CONFIG", rank, workers, chief)
    if "SLURM_PROCID" in environ and "SLURM_STEP_NUM_TASKS" in environ:
        rank, workers = int(environ["SLURM_PROCID"]), int(environ["SLURM_STEP_NUM_TASKS"])
        return Cluster("Slurm", rank, workers, rank == 0)
    raise NoClusterError(
        "trainer.strategy=multi_worker needs the cluster this process belongs to, and the environment describes "
        "none: set TF_CONFIG on every worker (the same \"cluster\", each its own \"task\" index; Kubernetes' TFJob "
        "and Ray Train set it), or start the workers with srun inside a Slurm allocation (srun sets SLURM_PROCID "
        "and SLURM_STEP_NUM_TASKS). For one machine use trainer.strategy=mirrored or none."
    )


def cluster_resolver(environ: Mapping[str, str] = os.environ):
    """TensorFlow's resolver for the cluster ``environ`` describes.

    ``TF_CONFIG``: ``TFConfigClusterResolver`` (it reads the process's own environment).
    Slurm: the job step's tasks in Slurm's order (``SLURM_STEP_NODELIST``, each node's tasks
    ``SLURM_STEP_TASKS_PER_NODE`` in a block, as Slurm's default distribution numbers them), on
    ports from ``SLURM_PORT_BASE`` (8888 unless set) counted up per task on a node; the GPUs
    are the ones Slurm gives each task (``--gpus-per-task``). TensorFlow's own
    ``SlurmClusterResolver`` is not used: it sorts the nodes by name, which is not the order
    Slurm numbers the tasks in (``node9`` before ``node10``), and it divides the node's GPUs
    among the tasks itself, failing on nodes with fewer GPUs than tasks.
    """
    import tensorflow as tf
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import expand_hostlist, expand_tasks_per_node

    cluster = describe_cluster(environ)
    if cluster.source == "TF_CONFIG":
        return tf.distribute.cluster_resolver.TFConfigClusterResolver()
    port_base = int(environ.get("SLURM_PORT_BASE", SLURM_PORT_BASE))
    hosts = expand_hostlist(environ["SLURM_STEP_NODELIST"])
    tasks = expand_tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"])
    workers = [f"{host}:{port_base + k}" for host, count in zip(hosts, tasks) for k in range(count)]
    if len(workers) != cluster.workers:
        raise NoClusterError(
            f"Slurm's job step lists {len(workers)} tasks on its nodes (SLURM_STEP_NODELIST={environ['SLURM_STEP_NODELIST']}, "
            f"SLURM_STEP_TASKS_PER_NODE={environ['SLURM_STEP_TASKS_PER_NODE']}) but has SLURM_STEP_NUM_TASKS={cluster.workers}; "
            "start the workers with one srun over the allocation (srun python -m heatinv.train ...)."
        )
    spec = tf.train.ClusterSpec({"worker": workers})
    return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="worker", task_id=cluster.index, rpc_layer="grpc")


_strategy = None


def multi_worker_strategy(timeout_seconds: float | None):
    """This process's ``MultiWorkerMirroredStrategy`` (made once: TensorFlow allows one per process).

    ``timeout_seconds``: how long a collective (a gradient all-reduce) waits for the other
    workers before it fails, so a worker that died stops the others instead of hanging them.
    Every worker waits here until all have joined.
    """
    global _strategy
    if _strategy is None:
        import tensorflow as tf

        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout_seconds)
        try:
            _strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver(), communication_options=options)
        except RuntimeError as error:
            if "at program startup" not in str(error):
                raise
            raise NoClusterError(
                "trainer.strategy=multi_worker was set where TensorFlow had started already (a config file or an "
                "experiment); the strategy has to be made before it starts. Give trainer.strategy=multi_worker on the "
                "command line."
            ) from None
    return _strategy
