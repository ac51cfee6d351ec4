#!/usr/bin/env bash
# One multi-worker job as two processes on this machine, each with its own TF_CONFIG (what
# Kubernetes' TFJob and Ray Train set on each worker). Run from anywhere with heatinv installed:
#
#   bash scripts/multi_worker/two_local_workers.sh outputs/two_workers [overrides ...]
#
# Worker 0 is the chief and writes the run into the folder given; worker 1 writes nothing
# there. After a lost worker (exit 4), the same command with trainer.resume=true continues.
set -euo pipefail
run_dir="$(realpath -m "${1:?the run directory, e.g. outputs/two_workers}")"
shift
ports=(${HEATINV_PORTS:-23456 23457})
cluster="{\"worker\": [\"localhost:${ports[0]}\", \"localhost:${ports[1]}\"]}"
pids=()
for index in 0 1; do
  TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": $index}}" \
    python -m heatinv.train trainer.strategy=multi_worker hydra.run.dir="$run_dir" "$@" \
    > >(sed "s/^/[worker $index] /") 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
