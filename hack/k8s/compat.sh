#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# compat.sh — render the tested-with matrix of docs/compatibility.md from
# the lab's records (hack/k8s/runs.tsv, which e2e.sh appends a line to for
# every mode it runs): one row per distinct setup (Kubernetes, runtime,
# cgroup version, kernel, families, topology, kube-proxy mode, chained
# primary) and command, with its last run's date, commit, result and time.
# Only what the runs recorded: a setup no run recorded has no row.
#   hack/k8s/compat.sh            rewrite the matrix between its markers
#   hack/k8s/compat.sh check      exit 1 when the page is not what the records give
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${COMPAT_RUNS:-hack/k8s/runs.tsv}   # (COMPAT_RUNS: another copy of the records, as test/docs passes the committed one)
page=docs/compatibility.md
matrix() {
  # (each run's date and commit stay in the records: the page is a
  # reference, in the present tense, that names no revision)
  echo '| Kubernetes | runtime | cgroup | kernel | families, nodes, kube-proxy | mode (primary) | result (s) | command |'
  echo '|---|---|---|---|---|---|---|---|'
  # newest run of each setup, setups by Kubernetes (newest first), runtime, mode
  tail -n +2 "$runs" | awk -F'\t' '{ key = $3 FS $4 FS $5 FS $6 FS $7 FS $8 FS $9 FS $10 FS $11 FS $12; last[key] = $0 }
    END { for (k in last) print last[k] }' |
    sort -t$'\t' -k3,3Vr -k4,4 -k10,10r -k7,7 -k8,8 |
    awk -F'\t' '{
      mode = $10; if ($11 != "none") mode = mode " (" $11 ")"
      gsub(/\|/, "\\|", $12)   # (a table cell: the pipes of E2E_RUN escaped)
      printf "| %s | %s | %s | %s | %s, %s, %s | %s | %s (%s) | `%s` |\n",
        $3, $4, $5, $6, $7, $8, $9, mode, $13, $14, $12 }'
}
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
awk -v m="$(matrix)" '
  /^<!-- matrix -->$/ { print; print m; skip = 1; next }
  /^<!-- \/matrix -->$/ { skip = 0 }
  !skip { print }' "$page" >"$tmp"
if [ "${1:-}" = check ]; then
  cmp -s "$tmp" "$page" || { echo "$page: the matrix is not what $runs gives: run hack/k8s/compat.sh" >&2; diff "$page" "$tmp" >&2; exit 1; }
else
  cat "$tmp" >"$page"
fi
