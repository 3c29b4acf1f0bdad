#!/usr/bin/env bash
# Debian packages the checks need: Prometheus and promtool (real scrapes and rule checks for the dashboard and alerts),
# openssl (a self-signed certificate for the extender's TLS test).
set -euo pipefail
need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
$SUDO apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
# The Debian package starts a system service where systemd runs; the tests start their own on loopback.
(command -v systemctl >/dev/null && $SUDO systemctl disable --now prometheus >/dev/null 2>&1) || true
