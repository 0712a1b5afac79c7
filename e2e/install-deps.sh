#!/usr/bin/env bash
# Debian packages the e2e harness needs: Prometheus (real, from Debian) and openssl
# (throwaway PKI). Installs only what is missing; needs root or sudo for apt.
set -euo pipefail
command -v go >/dev/null || { echo "[deps] Go >= 1.26 is required to build the control plane (https://go.dev/dl)" >&2; exit 1; }
need=()
command -v prometheus >/dev/null || need+=(prometheus)
command -v openssl >/dev/null || need+=(openssl)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "[deps] apt-get install ${need[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
