#!/usr/bin/env bash
# Makes the Secrets the manifests mount: recfleet-tls (a test-cluster CA and
# the server certificate, valid for the Services' names), recfleet-token (the
# users' bearer token: the job API), recfleet-worker-token (the workers'
# token: registration, heartbeats, the data loader) and
# recfleet-data-grant-key (the coordinator and the loader sign and check
# per-job data grants with it). Prints them as YAML; apply with
#
#   deploy/kubernetes/secrets.sh [NAMESPACE] | kubectl apply -f -
#
# and keep OUTDIR (default ./recfleet-secrets): it holds ca.pem and the token
# the CLI needs (RECFLEET_TLS_CA, RECFLEET_AUTH_TOKEN). For production, put
# certificates of your own PKI into recfleet-tls instead.
set -euo pipefail
ns=${1:-default}
out=${OUTDIR:-./recfleet-secrets}
here=$(cd "$(dirname "$0")" && pwd)
names=()
for svc in recfleet-coordinator recfleet-dataloader; do
  names+=(--name "$svc" --name "$svc.$ns" --name "$svc.$ns.svc" --name "$svc.$ns.svc.cluster.local")
done
"$here/../tls/make-certs.sh" "$out" --days 365 "${names[@]}" >&2
for secret in token worker-token data-grant-key; do
  [[ -f $out/$secret ]] || (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$out/$secret")
done
b64() { base64 -w0 "$1"; }
cat <<YAML
apiVersion: v1
kind: Secret
metadata: {name: recfleet-tls, namespace: $ns}
type: Opaque
data:
  ca.pem: $(b64 "$out/ca.pem")
  server.pem: $(b64 "$out/server.pem")
  server.key: $(b64 "$out/server.key")
---
apiVersion: v1
kind: Secret
metadata: {name: recfleet-token, namespace: $ns}
type: Opaque
data:
  token: $(b64 "$out/token")
---
apiVersion: v1
kind: Secret
metadata: {name: recfleet-worker-token, namespace: $ns}
type: Opaque
data:
  worker-token: $(b64 "$out/worker-token")
---
apiVersion: v1
kind: Secret
metadata: {name: recfleet-data-grant-key, namespace: $ns}
type: Opaque
data:
  data-grant-key: $(b64 "$out/data-grant-key")
YAML
