#!/usr/bin/env bash
# Makes a CA and the certificates of a test cluster with openssl:
#
#   deploy/tls/make-certs.sh OUTDIR [--name HOST]... [--days 30]
#
# OUTDIR gets ca.pem/ca.key (the CA), server.pem/server.key (one certificate
# every recfleet server presents: coordinator and data loaders) and
# client.pem/client.key (for mutual TLS: workers and users). The server
# certificate is valid for localhost, 127.0.0.1, ::1 and every --name (a DNS
# name or an IP address, e.g. a Kubernetes Service name). Keys are P-256 and
# unencrypted: this is for test clusters, not for production PKI.
#
# Servers:  --tls_cert=OUTDIR/server.pem --tls_key=OUTDIR/server.key
#           [--tls_client_ca=OUTDIR/ca.pem]
# Clients:  --tls_ca=OUTDIR/ca.pem [--tls_cert=OUTDIR/client.pem --tls_key=OUTDIR/client.key]
set -euo pipefail

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 ]] || usage
out=$1
shift
days=30
sans="DNS:localhost,IP:127.0.0.1,IP:::1"
while [[ $# -gt 0 ]]; do
  case $1 in
    --name)
      [[ $# -ge 2 ]] || usage
      if [[ $2 =~ ^[0-9.]+$ || $2 == *:* ]]; then sans+=",IP:$2"; else sans+=",DNS:$2"; fi
      shift 2 ;;
    --days) days=$2; shift 2 ;;
    *) echo "make-certs.sh: unknown flag $1" >&2; usage ;;
  esac
done
command -v openssl >/dev/null || { echo "make-certs.sh: openssl is required (tools/setup.sh installs it)" >&2; exit 1; }

mkdir -p "$out"
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
newkey=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)

openssl req -x509 "${newkey[@]}" -keyout "$out/ca.key" -out "$out/ca.pem" -days "$days" \
  -subj "/CN=recfleet test CA" -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

# sign NAME SUBJECT EXTENSIONS: OUTDIR/NAME.key and NAME.pem signed by the CA.
sign() {
  openssl req "${newkey[@]}" -keyout "$out/$1.key" -out "$tmp/$1.csr" -subj "$2" 2>/dev/null
  printf '%s\n' "$3" >"$tmp/$1.ext"
  openssl x509 -req -in "$tmp/$1.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days "$days" -extfile "$tmp/$1.ext" \
    -out "$out/$1.pem" 2>/dev/null
}
sign server "/CN=recfleet-server" "subjectAltName=$sans
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth"
sign client "/CN=recfleet-client" "keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
chmod 644 "$out"/*.pem
echo "make-certs.sh: CA, server and client certificates in $out (server names: $sans)"
