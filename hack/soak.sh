#!/usr/bin/env bash
# soak.sh runs the soak (test/soak, `make soak`): the real `shardproxy run` with three
# instances on a local control plane, ~1,000 Services under a seeded stream of changes,
# faults injected on their own schedules, and checkpoints where every instance's tables
# in the kernel must equal `shardproxy render` of the API's objects while steady
# Services' probes never fail. Prints a summary (SOAK lines) and exits non-zero if the
# soak failed. Root only.
#
# Settings (environment): SOAK_DURATION (default 10m), SOAK_SEED (printed by every run;
# set it to replay one), SOAK_SERVICES (1000), SOAK_RATE (changes per second, 10),
# SOAK_FAULTS_PER_KIND (3 from 10 minutes on, else 1), SOAK_CHECKPOINT_EVERY (90s),
# SOAK_FAULTS (comma-separated fault kinds, default all). Flags are passed through.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
go="${GO:-go}"
${go} build -o "${root}/bin/shardproxy-soak" ./test/soak/cmd/shardproxy-soak
exec "${root}/bin/shardproxy-soak" --repo "${root}" "$@"
