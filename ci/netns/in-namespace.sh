#!/usr/bin/env bash
# One MPI rank: runs the program inside the network namespace of the node this rank belongs
# to (its local rank's entry of SKYRIVER_NETNS_NAMESPACES). Started by ci/netns/mpirun.sh.
set -euo pipefail
read -r -a namespaces <<<"${SKYRIVER_NETNS_NAMESPACES:?set by ci/netns/mpirun.sh}"
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-0}}
namespace=${namespaces[$((local_rank % ${#namespaces[@]}))]}
exec ip netns exec "$namespace" "$@"
